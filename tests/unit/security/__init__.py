"""Attack suite: each test plays an attacker against one guard and expects the attack to fail."""

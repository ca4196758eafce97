"""Attack suite: each test is an attack from issue 11 that must fail for the attacker."""

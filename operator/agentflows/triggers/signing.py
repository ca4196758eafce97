"""Webhook signatures: which schemes the receiver accepts and what identifies a signed delivery.

Two schemes, keyed by the Secret the trigger names:

- GitHub style: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``. Nothing
  signed says when, so a captured delivery stays valid: the receiver refuses a body it has
  already accepted within its replay window, whatever delivery id comes with it.
- Standard Webhooks (standardwebhooks.com; Svix and others send it): ``webhook-id``,
  ``webhook-timestamp`` (Unix seconds) and ``webhook-signature: v1,<base64 HMAC-SHA256 of
  "{id}.{timestamp}.{body}">`` (several space-separated; any may match). The timestamp must be
  within ``tolerance`` of the receiver's clock, so a captured delivery expires; within the
  tolerance the replay window refuses it. A key written ``whsec_<base64>`` is decoded as the
  spec says; any other value is the key's bytes.

All comparisons are constant-time. Nothing here logs or returns a key or a signature.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
from collections.abc import Mapping

from agentflows.api import errors

SIGNATURE_HEADER = "X-Hub-Signature-256"
#: Delivery ids of GitHub-style senders; not signed, so never trusted to tell deliveries apart.
DELIVERY_HEADERS = ("X-GitHub-Delivery", "X-Delivery-Id")
STANDARD_ID = "webhook-id"
STANDARD_TIMESTAMP = "webhook-timestamp"
STANDARD_SIGNATURE = "webhook-signature"
STANDARD_KEY_PREFIX = "whsec_"


class StaleTimestamp(errors.AgentflowsError):
    """A correctly signed Standard Webhooks delivery whose timestamp is outside the tolerance."""


@dataclasses.dataclass(frozen=True)
class Signed:
    """A delivery whose signature verified."""

    #: The sender's delivery id ("" when none came): a redelivery of it is a duplicate.
    delivery: str
    #: SHA-256 of what was signed: the same value again within the window is a replay.
    digest: str


def signature(secret: bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value of ``body``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """True when ``header`` is the HMAC-SHA256 of ``body`` under ``secret`` (constant time)."""
    if not header:
        return False
    expected = signature(secret, body).encode()
    return hmac.compare_digest(expected, header.strip().encode("utf-8", "replace"))


def standard_key(secret: bytes) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_<base64>`` decoded, else as is)."""
    if secret.startswith(STANDARD_KEY_PREFIX.encode()):
        try:
            return base64.b64decode(secret[len(STANDARD_KEY_PREFIX) :], validate=True)
        except binascii.Error:
            return secret
    return secret


def standard_signature(secret: bytes, delivery: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of a Standard Webhooks delivery: ``v1,<base64>``."""
    signed = f"{delivery}.{timestamp}.".encode() + body
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(
    secret: bytes, body: bytes, headers: Mapping[str, str], now: float, tolerance: float
) -> Signed | None:
    """The verified delivery, or None when no accepted signature matches.

    Raises StaleTimestamp for a Standard Webhooks delivery signed correctly but outside the
    tolerance (checked only after the signature, so it tells nothing to someone without the key).
    """
    if STANDARD_SIGNATURE in headers:
        return _verify_standard(secret, body, headers, now, tolerance)
    if not verify_signature(secret, body, headers.get(SIGNATURE_HEADER)):
        return None
    delivery = next((headers[h] for h in DELIVERY_HEADERS if h in headers), "")
    return Signed(delivery, hashlib.sha256(body).hexdigest())


def _verify_standard(
    secret: bytes, body: bytes, headers: Mapping[str, str], now: float, tolerance: float
) -> Signed | None:
    delivery = headers.get(STANDARD_ID, "")
    stamp = headers.get(STANDARD_TIMESTAMP, "")
    if not delivery or not stamp.isdigit():
        return None
    expected = standard_signature(secret, delivery, int(stamp), body).encode()
    offered = headers[STANDARD_SIGNATURE].split()
    if not any(hmac.compare_digest(expected, s.encode("utf-8", "replace")) for s in offered):
        return None
    if abs(now - int(stamp)) > tolerance:
        raise StaleTimestamp(f"{STANDARD_TIMESTAMP} is more than {tolerance:.0f} s from now")
    signed = f"{delivery}.{stamp}.".encode() + body
    return Signed(delivery, hashlib.sha256(signed).hexdigest())

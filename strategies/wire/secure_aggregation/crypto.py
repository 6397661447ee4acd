"""The cryptography of SecAgg+, all of it from ``cryptography`` and Flower's primitives.

* **Key agreement**: X25519 (:mod:`cryptography.hazmat.primitives.asymmetric.x25519`),
  the 32-byte shared secret through HKDF-SHA256 with a purpose label, so the key that
  encrypts shares and the seed of a pairwise mask never coincide.
* **Share encryption**: Fernet (AES-128-CBC + HMAC-SHA256, authenticated), through
  :func:`flwr.common.secure_aggregation.crypto.symmetric_encryption.encrypt` /
  ``decrypt``; the plaintext is Flower's ``share_keys_plaintext_concat`` (source and
  destination index, then the two shares), so a share moved to another recipient or
  altered in transit is refused.
* **Secret sharing**: Shamir ``t``-out-of-``k`` over GF(2^128), Flower's
  :func:`~flwr.common.secure_aggregation.crypto.shamir.create_shares` /
  ``combine_shares``.
* **Masks**: the ChaCha20 key stream (:mod:`cryptography`) of a 32-byte seed, read as
  little-endian ``uint64`` and reduced mod ``m = 2^bits`` (a power of two: uniform).
  Bell et al. (2020) use AES-CTR as the PRG; any PRF-based stream serves.
* **Commitment** to a self-mask seed: SHA-256, checked after reconstruction.
"""

from __future__ import annotations

import base64
import hashlib

import numpy as np
from cryptography.exceptions import InvalidKey
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from Crypto.Protocol.SecretSharing import Shamir
from Crypto.Util.Padding import pad, unpad
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat, share_keys_plaintext_separate)

from strategies.wire.secure_aggregation.errors import SecAggError

#: Shamir's field is GF(2^128): a secret is shared 16 bytes at a time.
_SHAMIR_BLOCK = 16

__all__ = ["KEY_BYTES", "KeyPair", "add_mask", "commitment", "decrypt_shares",
           "encrypt_shares", "mask_seed", "public_of", "rebuild_secret", "split_secret"]

#: Bytes of an X25519 key, a self-mask seed and a pairwise mask seed.
KEY_BYTES = 32
_RAW = serialization.Encoding.Raw
_MASK_INFO = b"fedmed secagg+ pairwise mask"
_SHARES_INFO = b"fedmed secagg+ share encryption"
#: Mask values generated per ChaCha20 call (8 MB of key stream).
_CHUNK = 1 << 20


class KeyPair:
    """An X25519 key pair as raw bytes (what a site keeps in its state dir)."""

    def __init__(self, private: bytes | None = None) -> None:
        key = (X25519PrivateKey.generate() if private is None
               else X25519PrivateKey.from_private_bytes(private))
        self.private: bytes = key.private_bytes(_RAW, serialization.PrivateFormat.Raw,
                                                serialization.NoEncryption())
        self.public: bytes = key.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)


def public_of(private: bytes) -> bytes:
    """The public key of a raw X25519 private key."""
    return KeyPair(private).public


def _agreed(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 secret of ``private`` and ``peer_public``."""
    if len(peer_public) != KEY_BYTES:
        raise SecAggError(f"a public key has {len(peer_public)} bytes, not {KEY_BYTES}")
    try:
        secret = X25519PrivateKey.from_private_bytes(private).exchange(
            X25519PublicKey.from_public_bytes(peer_public))
    except (InvalidKey, ValueError) as error:  # an all-zero (low-order) shared point
        raise SecAggError(f"a public key gives no shared secret ({error})") from None
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def mask_seed(private: bytes, peer_public: bytes) -> bytes:
    """The pairwise mask seed ``s_ij`` (the same at both ends of the pair)."""
    return _agreed(private, peer_public, _MASK_INFO)


def _fernet_key(private: bytes, peer_public: bytes) -> bytes:
    return base64.urlsafe_b64encode(_agreed(private, peer_public, _SHARES_INFO))


def split_secret(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` Shamir shares of ``secret``, any ``threshold`` of which rebuild it.

    Byte for byte Flower's format (``flwr.common.secure_aggregation.crypto.shamir``:
    4 bytes of index, then one 16-byte share per 16-byte chunk of the padded secret) and
    pycryptodome's ``Shamir`` per chunk, as Flower's; without the thread pool Flower starts
    per call (a 32-byte secret is 3 chunks: the pool's start and its lock waits cost more
    than the field arithmetic, issue #46 item 6).
    """
    padded = pad(secret, _SHAMIR_BLOCK)
    shares = [bytearray(index.to_bytes(4, "little")) for index in range(1, count + 1)]
    for start in range(0, len(padded), _SHAMIR_BLOCK):
        for index, share in Shamir.split(threshold, count, padded[start:start + _SHAMIR_BLOCK],
                                         ssss=False):
            shares[index - 1] += share
    return [bytes(share) for share in shares]


def rebuild_secret(shares: list[bytes]) -> bytes:
    """The secret of ``shares`` (:class:`SecAggError` when they do not combine).

    The inverse of :func:`split_secret` (and of Flower's ``create_shares``), chunk by chunk
    with pycryptodome's ``Shamir.combine``.
    """
    try:
        chunks = (len(shares[0]) - 4) // _SHAMIR_BLOCK
        if chunks < 1 or any(len(share) != len(shares[0]) for share in shares):
            raise ValueError("shares of different sizes")
        indices = [int.from_bytes(share[:4], "little") for share in shares]
        padded = b"".join(Shamir.combine(
            [(index, share[4 + c * _SHAMIR_BLOCK:4 + (c + 1) * _SHAMIR_BLOCK])
             for index, share in zip(indices, shares)], ssss=False) for c in range(chunks))
        return unpad(padded, _SHAMIR_BLOCK)
    except (ValueError, IndexError) as error:
        raise SecAggError(f"shares do not combine ({error})") from None


def commitment(secret: bytes) -> bytes:
    """SHA-256 of ``secret``: published before the shares, checked after reconstruction."""
    return hashlib.sha256(secret).digest()


def encrypt_shares(private_c: bytes, peer_public_c: bytes, src: int, dst: int,
                   seed_share: bytes, key_share: bytes) -> bytes:
    """The ciphertext from ``src`` to ``dst`` of ``src``'s two shares for ``dst``."""
    return encrypt(_fernet_key(private_c, peer_public_c),
                   share_keys_plaintext_concat(src, dst, seed_share, key_share))


def decrypt_shares(private_c: bytes, peer_public_c: bytes, src: int, dst: int,
                   ciphertext: bytes) -> tuple[bytes, bytes]:
    """``(seed_share, key_share)`` that ``src`` encrypted for ``dst``.

    Raises
    ------
    SecAggError
        When the ciphertext was altered (Fernet's HMAC) or names other indices.
    """
    try:
        plaintext = decrypt(_fernet_key(private_c, peer_public_c), ciphertext)
    except (InvalidToken, ValueError, TypeError):
        raise SecAggError(f"the share from participant {src} fails authentication "
                          "(altered or not encrypted for this site)") from None
    sender, recipient, seed_share, key_share = share_keys_plaintext_separate(plaintext)
    if (sender, recipient) != (src, dst):
        raise SecAggError(f"the share from participant {src} to {dst} names {sender} -> "
                          f"{recipient}")
    return seed_share, key_share


def add_mask(total: np.ndarray, seed: bytes, modulus_bits: int, sign: int = 1) -> None:
    """``total <- total + sign * PRG(seed) mod 2^modulus_bits``, in place (``uint64``).

    The stream is ChaCha20's with ``seed`` as key and a zero nonce (every seed is
    fresh for one round and one purpose), generated in chunks of ``2^20`` values.
    """
    if len(seed) != KEY_BYTES:
        raise SecAggError(f"a mask seed has {len(seed)} bytes, not {KEY_BYTES}")
    keep = np.uint64((1 << modulus_bits) - 1)
    encryptor = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    for start in range(0, total.size, _CHUNK):
        part = total[start:start + _CHUNK]
        stream = np.frombuffer(encryptor.update(bytes(8 * part.size)), dtype="<u8") & keep
        if sign > 0:
            part += stream
        else:
            part -= stream
        part &= keep

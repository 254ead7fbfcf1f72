"""A connection's repeated quick reads, recognised by their bytes (SPEC §1.4).

A client that polls — an editor's session list, an agent asking for its session between
turns — sends the same request body again and again; only its ``id`` differs. Such a
body passed the door check, decoded into the same envelope and the same params Struct
the first time; the same bytes around a new id would do so again, so reading them again
is work without news. ``Replays`` keeps, per connection, the bodies of the last quick
reads it answered split around their id, and matches a later read against them: one
canonical frame (``Content-Length: N``, the whole body and nothing more) whose body is
a kept prefix, a plain id, and a kept suffix. A match gives the method, the decoded
params and the new id; anything else (another header, two frames, an id with an escape,
a body never seen) misses, and the read goes the usual way, which answers it the same.

What makes a match as good as a decode: a body is kept only after the id's place in it
was proved, by decoding the kept bytes around two other ids (a number and a string)
and finding each as the envelope's id with the method and params unchanged; and a
matching id is a plain JSON integer of at most 15 digits or a string of at most 64
printable ASCII characters without a quote, a backslash or a bracket — so the new body
nests, holds long digit runs and decodes exactly as the kept one did, the id aside.

Architecture Invariant: no I/O and no JSON-RPC dispatch here; bytes in, a match out.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dagctx.protocol import codec

#: a plain id: an integer (no leading zero, no ``-0``, at most 15 digits) or a short string
#: of printable ASCII with no quote, backslash or bracket — spelled exactly as the encoder
#: spells the id it decodes to, so an answer can carry the request's own bytes
_ID = re.compile(rb'0|-?[1-9][0-9]{0,14}|"[ !#-Z^-z|~]{0,64}"')
#: where an ``id`` member may start in a body (checked by decoding before it is trusted)
_ID_KEY = re.compile(rb'"id"[ \t\r\n]*:[ \t\r\n]*')
#: the ids a kept body is proved with (any plain id would do)
_PROOF_IDS = (b"7340033", b'"p-1"')
#: kept bodies per connection (a client seldom polls more than a few reads at once)
KEPT = 16


class Replay:
    """One kept body: what its bytes decoded to, the bytes after its id, and its last answer
    with what it is valid for (set by the server: ``QuickAnswers._replayed``)."""

    __slots__ = ("method", "params", "suffix", "answer")

    def __init__(self, method: str, params: Any, suffix: bytes) -> None:
        self.method = method
        self.params = params
        self.suffix = suffix
        self.answer: tuple[Any, ...] | None = None


class Replays:
    """A connection's kept quick-read bodies (all with one prefix: the bytes before the id,
    which a client writes the same way every time), by the bytes after their id."""

    __slots__ = ("prefix", "_by_suffix", "_head", "_longest")

    def __init__(self) -> None:
        self.prefix = b""
        self._by_suffix: dict[bytes, Replay] = {}
        #: a canonical header, the prefix and a plain id (``_ID``), as one pattern
        self._head: re.Pattern[bytes] | None = None
        #: the longest frame a kept body can make: anything longer (an append's 50 MB) is no
        #: match, and is never cut or hashed to find out
        self._longest = 0

    def match(self, data: bytes) -> tuple[bytes, Replay] | None:
        """``(id token, replay)`` when ``data`` is exactly one canonical frame whose body is a
        kept body with another plain id (its JSON bytes: ``id_of`` decodes them); None otherwise."""
        head = self._head
        if head is None or len(data) > self._longest:
            return None
        m = head.match(data)  # the header, the kept prefix and a plain id, in one look
        if m is None:
            return None
        replay = self._by_suffix.get(data[m.end():])
        if replay is None or int(m.group(1)) != len(data) - m.end(1) - 4:
            return None
        return m.group(2), replay

    def learn(self, body: bytes, msg_id: Any, method: str, params: Any) -> None:
        """Keep ``body`` (a quick read just answered: decoded to ``msg_id``, ``method`` and
        ``params``) once its id's place is proved; a body whose id cannot be placed is not
        kept. A prefix other than the kept one starts the keeping over."""
        if isinstance(msg_id, bool) or not isinstance(msg_id, (int, str)):
            return
        for key in _ID_KEY.finditer(body):
            m = _ID.match(body, key.end())
            if m is None or id_of(m.group()) != msg_id:
                continue
            prefix, suffix = body[: m.start()], body[m.end():]
            if prefix == self.prefix and suffix in self._by_suffix:
                return  # kept already
            if _proved(prefix, suffix, method, body):
                if prefix != self.prefix:
                    self.prefix, self._by_suffix, self._longest = prefix, {}, 0
                    self._head = re.compile(rb"Content-Length: ([0-9]{1,9})\r\n\r\n" + re.escape(prefix)
                                            + rb"(" + _ID.pattern + rb")")
                elif len(self._by_suffix) >= KEPT and suffix not in self._by_suffix:
                    self._by_suffix.clear()
                    self._longest = 0
                self._by_suffix[suffix] = Replay(method, params, suffix)
                # the header (16 + 9 digits + 4) and the longest plain id (66) around it
                self._longest = max(self._longest, len(prefix) + len(suffix) + 95)
                return


def id_of(token: bytes) -> Any:
    """The id a plain id's JSON bytes (``match``) decode to."""
    return token[1:-1].decode("ascii") if token[0] == 34 else int(token)


def _proved(prefix: bytes, suffix: bytes, method: str, body: bytes) -> bool:
    """Whether ``prefix + id + suffix`` decodes, for other ids, to that id with ``body``'s
    method and params: the place found is the envelope's own id, not text inside a value."""
    try:
        original = codec.envelope_decoder.decode(body)
        for token in _PROOF_IDS:
            env = codec.envelope_decoder.decode(prefix + token + suffix)
            if (env.id != id_of(token) or env.method != method or env.jsonrpc != original.jsonrpc
                    or _raw(env.params) != _raw(original.params)):
                return False
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True


def _raw(params: Any) -> Any:
    return bytes(params) if isinstance(params, msgspec.Raw) else params

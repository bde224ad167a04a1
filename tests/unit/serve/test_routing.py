"""How the router of `ENGRAM_API_WORKERS=N` reads a first request's head and picks its process."""

from __future__ import annotations

from api.serve.routed import PEEK_BYTES, authorization, bearer, head_complete, key_digest, owner


def test_the_authorization_header_is_found_in_any_case_and_position():
    head = b"GET /v1/memories HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer egk_a \r\nAccept: */*\r\n\r\n"
    assert authorization(head) == b"Bearer egk_a"
    assert authorization(head.replace(b"authorization", b"AUTHORIZATION")) == b"Bearer egk_a"
    first = b"POST /v1/search HTTP/1.1\r\nAuthorization: Bearer k\r\nHost: x\r\n\r\n"
    assert authorization(first) == b"Bearer k"


def test_a_head_routes_once_its_authorization_line_is_complete_not_before():
    whole = b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer egk_b\r\n\r\n"
    cut = whole.index(b"egk_b") + 3
    assert authorization(whole[:cut]) is None  # the value may go on
    assert not head_complete(whole[:cut])
    assert authorization(whole[: whole.index(b"\r\n\r\n") + 2]) == b"Bearer egk_b"


def test_no_header_before_the_blank_line_means_none_and_the_body_is_not_read():
    head = b"POST /v1/memories HTTP/1.1\r\nHost: x\r\n\r\nAuthorization: Bearer in-the-body\r\n"
    assert authorization(head) is None
    assert head_complete(head)
    # The request line is never taken for a header, even one that looks like it.
    assert authorization(b"Authorization: x HTTP/1.1\r\nHost: y\r\n\r\n") is None
    assert head_complete(b"GET / HTTP/1.1\r\nX: " + b"a" * PEEK_BYTES)


def test_the_key_is_read_from_the_header_as_the_api_reads_it():
    assert bearer(b"Bearer egk_a") == b"egk_a"
    assert bearer(b"bearer   egk_a ") == b"egk_a"
    assert bearer(b"Basic dXNlcg==") is None
    assert bearer(b"Bearer ") is None


def test_a_key_has_one_owner_and_keys_spread_over_the_processes():
    assert owner(b"egk_one", 4) == owner(b"egk_one", 4)
    owners = [owner(f"egk_{n}".encode(), 4) for n in range(400)]
    assert set(owners) == {0, 1, 2, 3}
    assert min(owners.count(index) for index in range(4)) > 50  # none starved: 100 each on average


def test_a_key_whose_tenant_is_known_goes_to_its_tenants_process():
    keys = [f"egk_{n}".encode() for n in range(40)]
    tenants = {key_digest(key): 7 for key in keys}  # forty keys of tenant 7
    assert {owner(key, 4, tenants) for key in keys} == {7 % 4}
    assert {owner(key, 4, {key_digest(key): tenant}) for tenant in range(8) for key in keys[:1]} == {0, 1, 2, 3}


def test_a_busy_tenant_is_served_by_its_processes_in_turn_and_an_unknown_key_by_its_hash():
    import socket

    from api.serve.routed import Router, tenant_processes

    assert tenant_processes(7, 4, 2) == [3, 0]
    assert tenant_processes(7, 4, 1) == [3]
    assert tenant_processes(5, 2, 3) == [1, 0]  # (never more than every process)
    with socket.socket() as listener:
        router = Router(listener, ["engram"], 4, per_tenant=2)
        router.clock = lambda: 0.0
        known, other, stranger = b"egk_known", b"egk_other", b"egk_stranger"
        router.tenants = {key_digest(known): 7, key_digest(other): 7}
        # The only tenant connecting: it takes a second process, its keys' connections alternating.
        turns = [router._route(known), router._route(other), router._route(known), router._route(known)]
        assert turns == [3, 0, 3, 0]
        assert {router._route(stranger) for _ in range(4)} == {owner(stranger, 4)}
        alone = Router(listener, ["engram"], 4, per_tenant=1)
        alone.tenants = router.tenants
        assert {alone._route(known) for _ in range(4)} == {3}


def test_tenants_sharing_the_connections_evenly_keep_one_process_each():
    import socket

    from api.serve.routed import Router

    with socket.socket() as listener:
        router = Router(listener, ["engram"], 4, per_tenant=2)
        router.clock = lambda: 0.0
        keys = [f"egk_{n}".encode() for n in range(4)]
        router.tenants = {key_digest(key): tenant for tenant, key in enumerate(keys)}
        routed: dict[int, set[int]] = {tenant: set() for tenant in range(4)}
        for _ in range(10):
            for tenant, key in enumerate(keys):
                routed[tenant].add(router._route(key))
        assert routed == {tenant: {tenant} for tenant in range(4)}
        # One of them then takes most of the new connections: past ~1.75/4 of the recent ones, a second process.
        hot = [router._route(keys[1]) for _ in range(40)]
        assert set(hot) == {1, 2}


def test_a_tenants_share_of_the_connections_fades_with_their_age():
    from api.serve.routed import Shares, processes_for_share

    shares = Shares(half_life=60.0)
    assert shares.add(1, now=0.0) == (1.0, 0)
    share, before = shares.add(2, now=60.0)
    assert abs(share - 1 / 1.5) < 1e-9 and before == 0  # (tenant 1's one connection weighs half by then)
    share, before = shares.add(2, now=600.0)
    assert abs(share - 1.0) < 0.01 and before == 1
    assert [processes_for_share(share, 4, 2) for share in (1.0, 0.5, 0.4, 0.25)] == [2, 2, 1, 1]
    assert [processes_for_share(share, 2, 2) for share in (1.0, 0.9, 0.6, 0.5)] == [2, 2, 1, 1]
    assert processes_for_share(1.0, 4, 1) == 1


def test_a_process_asking_the_others_is_answered_once_each_did_it_or_died():
    """Router side of api.serve.routed.ask_the_others, over real socket pairs: the request goes to every other
    live process, and the asking one is told only when each has said it is done, or has ended."""
    import socket
    import subprocess

    from api.serve.routed import _LEARNED, Router

    def received(end: socket.socket) -> tuple[bytes, int, int] | None:
        try:
            return _LEARNED.unpack(end.recv(64))
        except BlockingIOError:
            return None

    with socket.socket() as listener:
        router = Router(listener, ["engram"], 3)
        theirs, sleepers = [], []
        try:
            for process in router.processes:
                ours, their = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                ours.setblocking(False)
                their.setblocking(False)
                process.channel = ours
                process.popen = subprocess.Popen(["sleep", "60"])
                theirs.append(their)
                sleepers.append(process.popen)
            asking, answering, dying = router.processes

            theirs[0].send(_LEARNED.pack(b"f", 7, 42))  # process 0: have the others drop tenant 42
            router._hear(asking)
            told = [received(theirs[1]), received(theirs[2])]
            assert [t[0] for t in told if t] == [b"f", b"f"] and {t[2] for t in told if t} == {42}
            assert received(theirs[0]) is None

            theirs[1].send(_LEARNED.pack(b"k", told[0][1], 42))  # type: ignore[index]
            router._hear(answering)
            assert received(theirs[0]) is None  # (process 2 has not answered)

            dying.popen.kill()  # type: ignore[union-attr]
            dying.popen.wait()  # type: ignore[union-attr]
            router._end(dying)
            assert received(theirs[0]) == (b"d", 7, 42)
            assert router.asked == {}

            theirs[1].send(_LEARNED.pack(b"u", 8, 43))  # no other live process but 0: answered when 0 is
            router._hear(answering)
            request = received(theirs[0])
            assert request is not None and request[0] == b"u"
            theirs[0].send(_LEARNED.pack(b"k", request[1], 43))
            router._hear(asking)
            assert received(theirs[1]) == (b"d", 8, 43)
        finally:
            for sleeper in sleepers:
                sleeper.kill()
                sleeper.wait()
            for process in router.processes:
                if process.channel is not None:
                    process.channel.close()
            for their in theirs:
                their.close()

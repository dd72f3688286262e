"""The writer lease on the store, on a local directory, the S3 server and Azurite: one holder at a time (a race of
writers has one winner), a refusal that names the holder with secrets masked, renewal by compare-and-swap,
takeover of an expired lease (a killed writer blocks the next for at most twice the expiry, nothing to clear;
the expiry judged on the taker's own monotonic clock, never by comparing wall clocks), a holder that lost its
lease finding out before it commits, and the epoch every holder gets. Expiry is driven by injected clocks, not
sleeps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from msgstream_spark.mirror.store import Lease, LeaseHeld, LeaseLost, open_store
from tests.fixtures.s3_server import SECRET_KEY
from tests.mirror.store.racing import race


class Clock:
    """One injected clock for a test's writers: the wall clock their records carry and their own monotonic
    clock, whose waits pass at once (``sleep`` moves it)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def kw(self, own: bool = False) -> dict:
        """A writer's clocks: this wall clock; as its monotonic clock this one too, or (``own``: one of racing
        writers, whose waits must not move the others' time) a clock of its own."""
        mono = Clock() if own else self
        return {"clock": self, "monotonic": mono, "sleep": mono.sleep}


def test_one_holder_at_a_time_and_release(store):
    loc = store.root
    with Lease(store, loc, "mirror run", auto_renew=False) as a:
        a.check()
        held = r"being written by another writer \(pid \d+ on .*mirror run.*compact refused"
        with pytest.raises(LeaseHeld, match=held):
            Lease(store, loc, "compact", auto_renew=False).acquire()
    # released: the next writer gets it at once, no command needed
    with Lease(store, loc, "compact", auto_renew=False) as b:
        b.check()


def test_racing_writers_have_one_winner(store):
    leases = [Lease(store, store.root, f"writer {i}", auto_renew=False) for i in range(6)]
    won, refused = race([x.acquire for x in leases], LeaseHeld)
    assert len(won) == 1 and len(refused) == 5
    won[0].check()
    assert json.loads(store.read(won[0].uri))["holder"] == won[0].token


def test_an_expired_lease_is_taken_over_once_and_the_old_holder_stops(store):
    clock = Clock()
    old = Lease(store, store.root, "mirror run", expiry_s=60, **clock.kw(), auto_renew=False).acquire()
    clock.now += 59
    with pytest.raises(LeaseHeld, match="expires in 1s"):
        Lease(store, store.root, "compact", **clock.kw(), auto_renew=False).acquire()
    clock.now += 2  # the holder stalled past its expiry: two writers find it expired, one takes it
    takers = [Lease(store, store.root, f"taker {i}", **clock.kw(own=True), auto_renew=False) for i in range(4)]
    won, refused = race([t.acquire for t in takers], LeaseHeld)
    assert len(won) == 1 and len(refused) == 3
    with pytest.raises(LeaseLost, match="no longer this writer's"):
        old.check()  # before its commit, the stalled holder learns it lost the lease
    with pytest.raises(LeaseLost):
        old.renew()
    old.release()  # nothing of its own to release: the new holder keeps the lease
    won[0].check()


def test_renewal_pushes_the_expiry_and_a_stale_renewal_is_lost(store):
    clock = Clock()
    a = Lease(store, store.root, "mirror run", expiry_s=60, **clock.kw(), auto_renew=False).acquire()
    for _ in range(5):  # five renewals at expiry/3: the lease never runs out while its holder works
        clock.now += 20
        a.renew()
        a.check()
    with pytest.raises(LeaseHeld):
        Lease(store, store.root, "compact", **clock.kw(), auto_renew=False).acquire()
    clock.now += 45  # renewals failed for 45 s: less than expiry/3 left
    with pytest.raises(LeaseLost, match="runs out"):
        a.check()


def test_the_renewal_thread_keeps_the_lease(store):
    a = Lease(store, store.root, "mirror run", expiry_s=0.9).acquire()
    try:
        first = a.etag
        deadline = time.monotonic() + 30
        while a.etag == first and time.monotonic() < deadline:  # wait for a renewal, bounded
            time.sleep(0.05)
        assert a.etag != first
        a.check()
    finally:
        a.release()
    assert json.loads(store.read(a.uri))["expires"] == 0.0


def test_a_killed_writer_on_this_machine_is_taken_over_at_once(s3):
    """A holder SIGKILLed on this machine (same host, boot and pid namespace; its pid gone): its unexpired lease
    does not hold the next writer up, and its record never held the secret of its command line."""
    opts = s3.options()
    code = ("import sys, json; from msgstream_spark.mirror.store import open_store, Lease; "
            "s = open_store(sys.argv[1], json.loads(sys.argv[2]), env={}); "
            "Lease(s, s.root, 'mirror run', expiry_s=600).acquire(); print('held', flush=True); "
            "import time; time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, s3.uri("t"), json.dumps(opts),
                             f"--storage-option=aws_secret_access_key={SECRET_KEY}"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        store = open_store(s3.uri("t"), opts, env={})
        with pytest.raises(LeaseHeld) as e:
            Lease(store, store.root, "compact", auto_renew=False).acquire()
        assert f"pid {proc.pid}" in str(e.value) and SECRET_KEY not in str(e.value)
        assert SECRET_KEY not in store.read(store.join("_msgstream_writer.lease")).decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        got = Lease(store, store.root, "compact", auto_renew=False).acquire()  # no command, no wait
        got.check()
        got.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_writer_gone_elsewhere_blocks_the_next_for_at_most_the_expiry(store, monkeypatch):
    """A holder on another host that stopped renewing (killed, or cut off): refused while its record says it is
    live, then (its written expiry past) taken over with no command once the taker has seen the record unchanged
    for the expiry on its own clock; the record names the host."""
    from msgstream_spark.mirror.store import lease as lease_mod

    clock = Clock()
    real = lease_mod._identity
    monkeypatch.setattr(lease_mod, "_identity", lambda pid: {**real(pid), "host": "host-b", "pid": 4711})
    Lease(store, store.root, "mirror run", expiry_s=60, **clock.kw(), auto_renew=False).acquire()  # then it dies
    monkeypatch.setattr(lease_mod, "_identity", real)
    clock.now += 59
    with pytest.raises(LeaseHeld, match=r"pid 4711 on host-b: .* expires in 1s"):
        Lease(store, store.root, "mirror run", **clock.kw(), auto_renew=False).acquire()
    clock.now += 2
    before = clock.now
    Lease(store, store.root, "mirror run", **clock.kw(), auto_renew=False).acquire().check()
    assert clock.now - before >= 60  # the watch, on the taker's (injected) clock


def test_two_holders_in_one_process_are_two_writers(tmp_path):
    store = open_store(str(tmp_path / "t"))
    a = Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    with pytest.raises(LeaseHeld, match=f"pid {__import__('os').getpid()}"):
        Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    a.release()


def _hidden_proc(monkeypatch, lease_mod) -> None:
    """/proc restricted (``hidepid``, gVisor): no process's /proc/<pid>/stat can be read."""
    real = lease_mod._read
    monkeypatch.setattr(lease_mod, "_read", lambda path: "" if path.endswith("/stat") else real(path))


def _held_by(monkeypatch, lease_mod, store, pid: int) -> None:
    """A lease acquired in the name of process ``pid`` of this machine (host, boot and pid namespace ours)."""
    real = lease_mod._identity
    monkeypatch.setattr(lease_mod, "_identity", lambda p: {**real(p), "pid": pid, "started": "4242"})
    Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    monkeypatch.setattr(lease_mod, "_identity", real)


def test_a_live_holder_is_not_taken_for_gone_where_proc_is_restricted(tmp_path, monkeypatch):
    """A holder's /proc/<pid>/stat that cannot be read says nothing about it: a live holder (this process;
    ``kill(pid, 0)`` succeeds) and another user's live process (``kill`` answers EPERM) keep their leases."""
    import os

    from msgstream_spark.mirror.store import lease as lease_mod

    store = open_store(str(tmp_path / "t"))
    Lease(store, store.root, "mirror run", auto_renew=False).acquire()  # names this process
    _hidden_proc(monkeypatch, lease_mod)
    with pytest.raises(LeaseHeld, match=f"pid {os.getpid()} on"):
        Lease(store, store.root, "compact", auto_renew=False).acquire()

    other = open_store(str(tmp_path / "u"))
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as proc:
        _held_by(monkeypatch, lease_mod, other, proc.pid)
        real_kill = os.kill

        def another_users(pid: int, sig: int) -> None:
            if pid == proc.pid:
                raise PermissionError(1, "Operation not permitted")
            real_kill(pid, sig)

        monkeypatch.setattr(os, "kill", another_users)
        with pytest.raises(LeaseHeld, match=f"pid {proc.pid} on"):
            Lease(other, other.root, "compact", auto_renew=False).acquire()
        proc.stdin.close()


def test_a_dead_holder_is_taken_over_at_once_where_proc_is_restricted(tmp_path, monkeypatch):
    """ESRCH from ``kill(pid, 0)``: no process has the holder's pid, whatever /proc shows; its unexpired lease
    is taken over at once."""
    from msgstream_spark.mirror.store import lease as lease_mod

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # exited and reaped: its pid is free
    store = open_store(str(tmp_path / "t"))
    _held_by(monkeypatch, lease_mod, store, proc.pid)
    _hidden_proc(monkeypatch, lease_mod)
    got = Lease(store, store.root, "compact", auto_renew=False).acquire()
    got.check()
    assert json.loads(store.read(got.uri))["holder"] == got.token


SECRET = "Zq9v7Kx2Wm41"  # a value no masking rule knows by its look
# a command line naming a secret, in each backend's key names and each way a command gives one
SECRET_ARGS = {
    "s3 key": ["--storage-option", f"aws_secret_access_key={SECRET}"],
    "s3 alias": ["--storage-option", f"secret_access_key={SECRET}"],
    "s3 session token": ["--storage-option", f"AWS_SESSION_TOKEN={SECRET}"],
    "s3 token alias": ["--storage-option", f"session_token={SECRET}"],
    "gcs key": ["--storage-option", f"google_service_account_key={SECRET}"],
    "azure key": ["--storage-option", f"azure_storage_account_key={SECRET}"],
    "azure alias": ["--storage-option", f"account_key={SECRET}"],
    "azure sas": ["--storage-option", f"azure_storage_sas_key=sv=2024&sig={SECRET}"],
    "azure client secret": ["--storage-option", f"client_secret={SECRET}"],
    "adls key": ["--catalog-option", f"adls.account-key={SECRET}"],
    "adls connection string": ["--catalog-option",
                               f"adls.connection-string=DefaultEndpointsProtocol=https;AccountKey={SECRET}"],
    "adls sas": ["--catalog-option", f"adls.sas-token={SECRET}"],
    "pyiceberg s3": ["--catalog-option", f"s3.secret-access-key={SECRET}"],
    "pyiceberg session": ["--catalog-option", f"s3.session-token={SECRET}"],
    "gcs oauth": ["--catalog-option", f"gcs.oauth2.token={SECRET}"],
    "rest token": ["--catalog-option", f"token={SECRET}"],
    "rest credential": ["--catalog-option", f"credential=client-id:{SECRET}"],
    "rest header": ["--catalog-option", f"header.Authorization=Bearer {SECRET}"],
    "rest header unquoted": ["--catalog-option", "header.Authorization=Bearer", SECRET],
    "kafka sasl": ["--option", f"kafka.sasl.password={SECRET}"],
    "milvus yaml key": ["--option", f"kafka.saslPassword={SECRET}"],
    "pulsar auth": ["--option", f"pulsar.authParams=token:{SECRET}"],
    "flag with =": [f"--storage-option=aws_secret_access_key={SECRET}"],
    "secret flag": ["--password", SECRET],
    "hadoop": [f"-Dspark.hadoop.fs.s3a.secret.key={SECRET}"],
    "url": ["--catalog-uri", f"postgresql://mirror:{SECRET}@db:5432/catalog"],
}


@pytest.mark.parametrize("args", SECRET_ARGS.values(), ids=SECRET_ARGS.keys())
def test_no_secret_of_the_command_line_in_the_lease_or_its_refusal(tmp_path, monkeypatch, args):
    """The record names the holder's command line: every secret in it is masked, whatever the backend's key
    name, in the record's bytes and in the refusal that quotes it (the store's settings hold none of them:
    only the command line's own form gives it away)."""
    store = open_store(str(tmp_path / "t"))
    monkeypatch.setattr(sys, "argv", ["msgstream", "mirror", "run", "--table", "t", *args, "--trigger-s", "5"])
    held = Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    record = store.read(held.uri)
    assert SECRET.encode() not in record
    command = json.loads(record)["command"]
    assert command.startswith("msgstream mirror run --table t") and command.endswith("--trigger-s 5")
    assert "******" in command
    with pytest.raises(LeaseHeld) as e:
        Lease(store, store.root, "compact", auto_renew=False).acquire()
    assert "******" in str(e.value) and SECRET not in str(e.value)


def test_a_live_holder_whose_clock_lags_is_never_taken_over(store):
    """#45 item 1: expiry is judged on the taker's own monotonic clock, not by comparing two machines' wall
    clocks. A live holder whose wall clock is two minutes behind writes an expiry that is already past on the
    taker's: the taker watches the record, sees it renewed and is refused naming the holder; once the holder
    stops renewing, the record unchanged for the expiry on the taker's clock is taken over. Before #45 the taker
    took the live holder's lease at once."""
    lagging, taker_clock = Clock(), Clock()
    lagging.now -= 120
    holder = Lease(store, store.root, "mirror run", expiry_s=60, **lagging.kw(), auto_renew=False).acquire()
    renewing = [True]

    def sleep(seconds: float) -> None:  # while the taker waits, the holder's renewal thread renews
        taker_clock.sleep(seconds)
        if renewing[0] and seconds:
            lagging.sleep(seconds)
            holder.renew()

    taker = Lease(store, store.root, "compact", clock=taker_clock, monotonic=taker_clock, sleep=sleep,
                  auto_renew=False)
    with pytest.raises(LeaseHeld, match="being written by another writer .*mirror run"):
        taker.acquire()
    holder.check()
    renewing[0] = False  # the holder is killed: its record stays as it was
    taker.acquire().check()
    with pytest.raises(LeaseLost):
        holder.check()


def test_a_record_that_says_it_is_live_is_taken_over_by_a_writer_that_waited_its_expiry(store):
    """A holder elsewhere whose clock runs ahead wrote an expiry hours away and died: the first ask is refused at
    once (naming it); the same writer asking again once it has seen the record unchanged for its expiry on its
    own clock takes it over, whatever the record says. Before #45 it waited for the record's expiry."""
    ahead, mine = Clock(), Clock()
    ahead.now += 7200
    Lease(store, store.root, "mirror run", expiry_s=60, **ahead.kw(), auto_renew=False).acquire()  # then it dies
    waiting = Lease(store, store.root, "mirror run", **mine.kw(), auto_renew=False)
    with pytest.raises(LeaseHeld, match="expires in 7260s"):
        waiting.acquire()
    mine.now += 30
    with pytest.raises(LeaseHeld):
        waiting.acquire()
    mine.now += 31
    waiting.acquire().check()


def test_every_holder_has_an_epoch_above_the_one_before(store):
    """The lease record carries its holder's epoch: 1 for a new lease, one more at every takeover (after a
    release or an expiry); a holder raises its own (a table already at it), which its successor then passes; a
    deposed holder cannot raise it."""
    clock = Clock()

    def lease(what: str) -> Lease:
        return Lease(store, store.root, what, expiry_s=60, **clock.kw(), auto_renew=False)

    a = lease("a").acquire()
    assert a.epoch == 1 and json.loads(store.read(a.uri))["epoch"] == 1
    a.release()
    b = lease("b").acquire()
    assert b.epoch == 2
    b.raise_epoch(7)
    assert b.epoch == 7 and json.loads(store.read(b.uri))["epoch"] == 7
    b.check()
    clock.now += 61  # b stalls past its expiry
    c = lease("c").acquire()
    assert c.epoch == 8
    with pytest.raises(LeaseLost):
        b.raise_epoch(9)
    assert b.epoch == 7 and json.loads(store.read(c.uri))["epoch"] == 8

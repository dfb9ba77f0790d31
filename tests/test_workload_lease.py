"""The writer lease is mutual exclusion: two runs never both believe they hold it, on S3 or a local path.

Races are made on the wire (a proxy in front of a real moto S3 that delays or cuts one PUT) and with
real processes on a real directory; nothing in our code is patched.
"""

import json
import subprocess
import sys
import threading
import time

import boto3
import pytest

from gpuyard.jobs.workload.lease import LEASE, Lease, LeaseHeld
from gpuyard.jobs.workload.storage import Conflict, LocalStorage, S3Storage
from workload_launch import REPO, FaultyProxy

pytestmark = pytest.mark.slow
SECONDS = 3.0


@pytest.fixture
def bucket(local_aws):
    boto3.client("s3").create_bucket(Bucket="ckpt")
    return local_aws


def test_a_lease_put_delayed_on_the_wire_does_not_overwrite_the_run_that_took_it_meanwhile(bucket, monkeypatch):
    """Run A reads "no lease" and PUTs; its PUT is held on the wire while run B takes the lease; A's PUT then
    arrives. Unconditional PUTs (issue 24) let it overwrite B's lease: both ran believing they held it."""
    proxy = FaultyProxy(bucket.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    slow = S3Storage("ckpt", "run", attempts=3, base_delay=0.05)  # run A's requests go through the proxy
    monkeypatch.setenv("AWS_ENDPOINT_URL", bucket.endpoint_url)
    first, second = Lease(slow, SECONDS, owner="run-a"), Lease(S3Storage("ckpt", "run"), SECONDS, owner="run-b")
    proxy.delay(f"PUT /ckpt/run/{LEASE}".encode())
    outcome: dict[str, object] = {}
    acquiring = threading.Thread(target=_acquire, args=(first, outcome), daemon=True)
    acquiring.start()
    assert proxy.delayed.wait(timeout=30)
    second.acquire()  # B finds no lease and takes it while A's PUT waits on the wire
    proxy.release()
    acquiring.join(timeout=60)
    try:
        assert isinstance(outcome.get("run-a"), LeaseHeld), outcome
        assert "is held by run-b" in str(outcome["run-a"])
        second.confirm()  # B still holds it
        assert json.loads(boto3.client("s3").get_object(Bucket="ckpt", Key=f"run/{LEASE}")["Body"].read())[
            "owner"] == "run-b"
    finally:
        second.release()
        first.release()
        proxy.close()


def _acquire(lease: Lease, outcome: dict) -> None:
    try:
        lease.acquire()
        outcome[lease.owner] = "held"
    except LeaseHeld as error:
        outcome[lease.owner] = error


def test_a_lease_create_whose_response_was_lost_is_found_to_be_ours_on_retry(bucket, monkeypatch):
    """The PUT lands, the reply is lost, the client retries: the conditional create fails (412) on its own lease,
    which it then recognises as its own."""
    proxy = FaultyProxy(bucket.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    lease = Lease(S3Storage("ckpt", "run", attempts=4, base_delay=0.5), SECONDS, owner="run-a")
    proxy.cut_after(f"PUT /ckpt/run/{LEASE}".encode())
    threading.Thread(target=_up_after_the_cut, args=(proxy,), daemon=True).start()
    try:
        lease.acquire()
        assert proxy.cut.is_set()
        lease.confirm()
    finally:
        lease.release()
        proxy.close()
    assert "Contents" not in bucket.client("s3").list_objects_v2(Bucket="ckpt")  # released


def _up_after_the_cut(proxy: FaultyProxy) -> None:
    """The network comes back soon after the reply was lost, before the client's retries run out."""
    if proxy.cut.wait(timeout=60):
        time.sleep(0.3)
        proxy.up()


def test_a_lease_taken_over_is_lost_by_its_holder_at_its_next_heartbeat(bucket):
    holder, storage = Lease(S3Storage("ckpt", "run"), 1.0, owner="run-a"), S3Storage("ckpt", "run")
    holder.acquire()
    while True:  # as another run takes it over: replace the version just read (the heartbeat may renew it first)
        try:
            storage.put_if(LEASE, json.dumps({"owner": "run-b", "beats": 9, "expires_at": 0}).encode(),
                           storage.read(LEASE)[1])
            break
        except Conflict:
            continue
    time.sleep(1.0)  # a heartbeat every lease period / 3
    assert holder.lost and "is held by run-b" in holder.lost_message
    with pytest.raises(LeaseHeld):
        holder.confirm()
    holder.release()
    assert json.loads(S3Storage("ckpt", "run").get(LEASE))["owner"] == "run-b"  # a lost lease is not deleted


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_conditional_writes_create_once_and_replace_only_the_version_read(backend, tmp_path, request):
    if backend == "s3":
        request.getfixturevalue("bucket")
        storage = S3Storage("ckpt", "run")
    else:
        storage = LocalStorage(tmp_path)
    etag = storage.put_if("x", b"first", None)
    with pytest.raises(Conflict):
        storage.put_if("x", b"again", None)
    newer = storage.put_if("x", b"second", etag)
    with pytest.raises(Conflict):
        storage.put_if("x", b"stale", etag)
    with pytest.raises(Conflict):
        storage.delete_if("x", etag)
    assert storage.read("x") == (b"second", newer)
    storage.delete_if("x", newer)
    assert "x" not in storage.names()


RACER = """
import sys, time
from pathlib import Path
from gpuyard.jobs.workload.lease import Lease, LeaseHeld
from gpuyard.jobs.workload.storage import LocalStorage
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
lease = Lease(LocalStorage(Path(sys.argv[1])), 30.0, owner=sys.argv[3])
try:
    lease.acquire()
    held = time.time()
    time.sleep(1.0)
    lease.confirm()
    print(held, time.time(), flush=True)
    lease.release()
except LeaseHeld:
    print("refused", flush=True)
"""


def test_runs_starting_together_on_a_local_path_never_hold_the_lease_at_the_same_time(tmp_path):
    """Each racer holds the lease for a second, then releases it: a waiting racer may take it next, never meanwhile."""
    for round_ in range(5):
        folder = tmp_path / f"round-{round_}"
        folder.mkdir()
        start = time.time() + 2.0
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(folder), str(start), f"run-{i}"], cwd=REPO,
                                   stdout=subprocess.PIPE, text=True) for i in range(3)]
        outputs = [racer.communicate(timeout=120)[0].split() for racer in racers]
        held = sorted((float(first), float(last)) for first, last in (o for o in outputs if o != ["refused"]))
        assert held and all(later[0] >= earlier[1] for earlier, later in zip(held, held[1:])), outputs


def test_a_lease_that_is_a_folder_cannot_be_held_in_one_line(tmp_path):
    (tmp_path / LEASE).mkdir()
    with pytest.raises(LeaseHeld, match="a folder, not a file: remove it"):
        Lease(LocalStorage(tmp_path), SECONDS).acquire()


def test_a_local_folder_that_does_not_exist_yet_is_made_by_the_first_lease(tmp_path):
    """A user's script on a laptop (`GPUYARD_CHECKPOINT_URI=runs/mine`) takes the lease before anything else writes:
    the folder is made then, as an S3 prefix needs no making (it failed as `lease.json: missing`)."""
    storage = LocalStorage(tmp_path / "runs" / "mine")
    lease = Lease(storage, SECONDS, owner="laptop")
    lease.acquire()
    assert json.loads((tmp_path / "runs" / "mine" / LEASE).read_text())["owner"] == "laptop"
    lease.release()
    assert storage.names() == []

"""Randomized operation sequences, the same seed against ZooKeeper 3.8 and the coordinator."""

import os
import random

import pytest

from compat import Recorder
from test_compat import both

SEEDS = int(os.environ.get("MERGESTREAM_ZK_RANDOM_SEEDS", "12"))


def make_script(seed, prefix):
    rng = random.Random(seed)
    paths = [prefix + p for p in ["", "/a", "/b", "/a/c", "/a/d", "/b/e", "/a/c/f"]]

    def random_write(t=None):
        p = rng.choice(paths)
        kind = rng.choice(["create", "create", "delete", "set", "check"])
        version = rng.choice([-1, -1, 0, 1, 2])
        if kind == "create":
            eph, seq = rng.random() < 0.2, rng.random() < 0.2
            return kind, p, dict(value=bytes([rng.randrange(256)]) * rng.randrange(4), ephemeral=eph, sequence=seq)
        if kind == "delete":
            return kind, p, dict(version=version)
        if kind == "set":
            return kind, p, dict(value=b"v" * rng.randrange(5), version=version)
        return kind, p, dict(version=version)

    steps = []
    for _ in range(60):
        roll = rng.random()
        if roll < 0.45:
            steps.append(("write", random_write()))
        elif roll < 0.55:
            steps.append(("multi", [random_write() for _ in range(rng.randrange(1, 5))]))
        else:
            kind = rng.choice(["get", "exists", "children"])
            steps.append(("read", (kind, rng.choice(paths), rng.random() < 0.4)))

    def script(r):
        zk = r.clients[0]
        for i, (what, step) in enumerate(steps):
            if what == "write":
                kind, p, kw = step
                if kind == "check":
                    t = zk.transaction()
                    t.check(p, kw["version"])
                    r.call(f"{i} check {p}", t.commit)
                elif kind == "create":
                    r.call(f"{i} create {p}", zk.create, p, kw["value"], ephemeral=kw["ephemeral"], sequence=kw["sequence"])
                elif kind == "delete":
                    r.call(f"{i} delete {p}", zk.delete, p, version=kw["version"])
                else:
                    r.call(f"{i} set {p}", zk.set, p, kw["value"], version=kw["version"])
            elif what == "multi":
                t = zk.transaction()
                for kind, p, kw in step:
                    if kind == "create":
                        t.create(p, kw["value"], ephemeral=kw["ephemeral"], sequence=kw["sequence"])
                    elif kind == "delete":
                        t.delete(p, version=kw["version"])
                    elif kind == "set":
                        t.set_data(p, kw["value"], version=kw["version"])
                    else:
                        t.check(p, kw["version"])
                r.call(f"{i} multi", t.commit)
            else:
                kind, p, watch = step
                w = r.watcher(f"{i}") if watch else None
                if kind == "get":
                    r.call(f"{i} get {p}", zk.get, p, watch=w)
                elif kind == "exists":
                    r.call(f"{i} exists {p}", zk.exists, p, watch=w)
                else:
                    r.call(f"get_children {i} {p}", zk.get_children, p, watch=w, include_data=True)
        for p in paths:
            r.call(f"final {p}", zk.exists, p)

    return script


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_sequence(zookeeper, coordinator, prefix, seed):
    log, _ = both(zookeeper, coordinator, make_script(seed, prefix))
    assert any(result not in (None, "NoNodeError") for _, result in log)


def test_recorder_sees_differences(zookeeper):
    """The comparison can fail: two different scripts record different logs."""
    outcomes = []
    for value in (b"x", b"xy"):
        r = Recorder(zookeeper.hosts)
        r.call("create", r.clients[0].create, f"/recorder_check_{len(value)}", value)
        r.call("get", r.clients[0].exists, f"/recorder_check_{len(value)}")
        outcomes.append(r.result())
        r.close()
    assert outcomes[0] != outcomes[1]

"""The throw-away Ray cluster of the tests (dyntrain.testing.raycluster): a node whose
registration Ray itself gave up on (a fixed 30 s wait, which a loaded 2-core machine can
exceed) is started again; any other failure is said at once. A stand-in `ray` command plays
`ray start`, so no Ray runs here."""

import os

import pytest

from dyntrain.testing.raycluster import NODE_START_TRIES, REGISTRATION_TIMEOUT, LocalRayCluster


def fake_ray(tmp_path, fail_first: int, why: str) -> tuple[LocalRayCluster, os.PathLike]:
    """A cluster whose `ray` fails its first ``fail_first`` starts saying ``why``, then runs
    (says "block forever" and sleeps); returns it and the file that counts the starts."""
    bin_dir, tries = tmp_path / "bin", tmp_path / "tries"
    bin_dir.mkdir()
    ray = bin_dir / "ray"
    ray.write_text(f"""#!/bin/sh
echo start >> {tries}
if [ "$(wc -l < {tries})" -le {fail_first} ]; then echo "Exception: {why}"; exit 1; fi
echo "Ray runtime started. --block: this command will now block forever"
exec sleep 120
""")
    ray.chmod(0o755)
    cluster = LocalRayCluster(start_timeout=60)
    cluster.env = lambda: {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return cluster, tries


def test_a_node_whose_registration_ray_gave_up_on_is_started_again(tmp_path):
    cluster, tries = fake_ray(tmp_path, NODE_START_TRIES - 1, f"{REGISTRATION_TIMEOUT}. This")
    try:
        node = cluster.add_node("n1", 1, {"dyntrain_ce_spot": 1})
        assert tries.read_text().count("start") == NODE_START_TRIES
        assert node.proc.poll() is None  # the last try runs
    finally:
        cluster.close()
    assert node.proc.poll() is not None  # and close() ended it


def test_a_node_that_fails_otherwise_or_too_often_is_said_at_once(tmp_path):
    cluster, tries = fake_ray(tmp_path, 1, "port 6379 is in use")
    try:
        with pytest.raises(RuntimeError, match=r"ray node n1 did not start \(try 1\): .*in use"):
            cluster.add_node("n1", 1, {})
    finally:
        cluster.close()
    assert tries.read_text().count("start") == 1


def test_a_node_whose_registration_always_times_out_gives_up_after_its_tries(tmp_path):
    cluster, tries = fake_ray(tmp_path, NODE_START_TRIES, REGISTRATION_TIMEOUT)
    try:
        with pytest.raises(RuntimeError, match=rf"did not start \(try {NODE_START_TRIES}\)"):
            cluster.add_node("n1", 1, {})
    finally:
        cluster.close()
    assert tries.read_text().count("start") == NODE_START_TRIES

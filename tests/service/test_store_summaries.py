"""The store's reads for the dashboard and /metrics, on SQLite and PostgreSQL."""

from __future__ import annotations

from dyntrain.service.core.model import CapacityType, ComputeEnvironmentSpec, JobQueueSpec
from dyntrain.service.core.model import JobStatus as S


def setup(store):
    store.environments.create_compute_environment(
        ComputeEnvironmentSpec("od", CapacityType.ON_DEMAND, 1.0))
    store.environments.create_job_queue(JobQueueSpec("a", 10, ("od",)))
    store.environments.create_job_queue(JobQueueSpec("b", 1, ("od",)))


def test_counts_by_queue_and_status_count_array_children_not_parents(store):
    setup(store)
    for _ in range(2):
        store.jobs.submit(queue="a", command=["true"])
    runnable = store.jobs.submit(queue="b", command=["true"])
    assert store.jobs.transition(runnable.id, S.SUBMITTED, S.RUNNABLE)
    store.jobs.submit(queue="b", command=["true"], array_size=3)
    assert store.summaries.count_jobs_by_queue_and_status() == {("a", S.SUBMITTED): 2,
                                                      ("b", S.RUNNABLE): 1,
                                                      ("b", S.SUBMITTED): 3}


def test_search_jobs_newest_first_with_filters_text_and_totals(store):
    setup(store)
    clock = iter(range(1000, 2000))
    store.clock = lambda: float(next(clock))
    ids = [store.jobs.submit(queue="a" if i % 2 else "b", command=["true"], name=f"job_{i}").id
           for i in range(5)]
    store.jobs.submit(queue="a", command=["true"], name="zz-done")
    arr = store.jobs.submit(queue="a", command=["true"], name="arr", array_size=3)

    jobs, total = store.summaries.search_jobs(limit=3)
    assert total == 7 and [j.name for j in jobs] == ["arr", "zz-done", "job_4"]
    jobs, total = store.summaries.search_jobs(limit=3, offset=3)
    assert [j.id for j in jobs] == ids[3::-1][:3]

    assert [j.name for j in store.summaries.search_jobs(queue="b")[0]] == ["job_4", "job_2",
                                                                           "job_0"]
    assert store.jobs.transition(ids[1], S.SUBMITTED, S.RUNNABLE)
    assert [j.id for j in store.summaries.search_jobs(status=["RUNNABLE"])[0]] == [ids[1]]
    # text: a name's part or an id's start; LIKE wildcards in it are literal
    assert [j.name for j in store.summaries.search_jobs(text="b_3")[0]] == ["job_3"]
    assert [j.name for j in store.summaries.search_jobs(text="job_")[0]] == [
        f"job_{i}" for i in range(4, -1, -1)]
    assert store.summaries.search_jobs(text="%")[1] == 0
    assert store.summaries.search_jobs(text="_")[1] == 5
    assert [j.id for j in store.summaries.search_jobs(text=ids[2][:8])[0]] == [ids[2]]
    # children of an array job, by index
    children, total = store.summaries.search_jobs(parent=arr.id)
    assert total == 3 and [c.array_index for c in children] == [0, 1, 2]


def test_events_by_kind_and_one_jobs_membership_events(store):
    setup(store)
    one = store.jobs.submit(queue="a", command=["true"]).id
    two = store.jobs.submit(queue="a", command=["true"]).id
    store.logs.add_event(one, "membership.start", {"world_after": 1})
    store.logs.add_event(one, "coordinator", {"message": "generation 0"})
    store.logs.add_event(one, "membership.join", {"world_after": 2})
    store.logs.add_event(two, "membership.join", {"world_after": 3})
    store.logs.add_event(None, "membership_x", {})  # '_' in the prefix is not a wildcard
    assert store.summaries.count_events_by_kind("membership.") == {"membership.start": 1,
                                                         "membership.join": 2}
    found = store.summaries.list_job_events(one, "membership.")
    assert [(e.kind, e.payload["world_after"]) for e in found] == [
        ("membership.start", 1), ("membership.join", 2)]

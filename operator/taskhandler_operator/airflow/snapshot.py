"""One refresh's stub inventory, with its Dags indexed by queue (pure; no I/O).

Every bundle validates against the same inventory, and a bundle concerns only the Dags with
a stub on one of its queues (or a read problem that may be on one). Walking every Dag of
Airflow in every pass made a pass cost O(Dags) rather than O(its own Dags); the index is built
once per refresh that changed something (at most about once a second) and read by every pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping

from taskhandler_operator.airflow.serialized import DagStubs


class InventorySnapshot(Mapping[str, DagStubs]):
    """The Dags by ``dag_id``, immutable, with which Dags each queue concerns.

    A Dag concerns a queue when it has a stub on it, or a read problem on it; a read problem
    whose queue is unknown concerns every queue (as in :mod:`taskhandler_operator.validation`).
    """

    __slots__ = ("_any_queue", "_dags", "_problems_on", "_stubs_on")

    def __init__(self, dags: Mapping[str, DagStubs] | None = None) -> None:
        self._dags: dict[str, DagStubs] = dict(dags or {})
        stubs_on: defaultdict[str, set[str]] = defaultdict(set)
        problems_on: defaultdict[str, set[str]] = defaultdict(set)
        any_queue: set[str] = set()
        for dag_id, dag in self._dags.items():
            for stub in dag.stubs:
                stubs_on[stub.queue].add(dag_id)
            for problem in dag.problems:
                if problem.queue is None:
                    any_queue.add(dag_id)
                else:
                    problems_on[problem.queue].add(dag_id)
        # Tuples, not sets: a thousand queues of one Dag each, kept by every snapshot alive.
        self._stubs_on = {queue: tuple(ids) for queue, ids in stubs_on.items()}
        self._problems_on = {queue: tuple(ids) for queue, ids in problems_on.items()}
        self._any_queue = tuple(any_queue)

    @classmethod
    def of(cls, dags: Mapping[str, DagStubs]) -> InventorySnapshot:
        """``dags`` itself when it is a snapshot (the inventory's), else one built from it."""
        return dags if isinstance(dags, cls) else cls(dags)

    def __getitem__(self, dag_id: str) -> DagStubs:
        return self._dags[dag_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dags)

    def __len__(self) -> int:
        return len(self._dags)

    def __contains__(self, dag_id: object) -> bool:
        return dag_id in self._dags

    def __repr__(self) -> str:
        return f"InventorySnapshot({len(self._dags)} Dags)"

    def with_stubs_on(self, queues: Iterable[str]) -> tuple[str, ...]:
        """The Dags with a stub on one of ``queues``, sorted."""
        ids: set[str] = set()
        for queue in set(queues):
            ids.update(self._stubs_on.get(queue, ()))
        return tuple(sorted(ids))

    def concerning(self, queues: Iterable[str]) -> list[DagStubs]:
        """The Dags a bundle serving ``queues`` validates, sorted by ``dag_id``: a stub on one
        of them, or a read problem that may be on one. Any other Dag's verdict is "no binding,
        no problem" (the writer removes the bundle's rows of it)."""
        wanted = set(queues)
        ids = set(self._any_queue)
        for queue in wanted:
            ids.update(self._stubs_on.get(queue, ()))
            ids.update(self._problems_on.get(queue, ()))
        return [self._dags[dag_id] for dag_id in sorted(ids)]

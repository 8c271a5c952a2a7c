"""The router's picture of what each instance's prefix cache holds: the chunk hashes (fleet/prefix_hashes.py) of the
prompts this router sent it, and those the instance reported it served (`InstanceReport.cached_prefixes`).

A chain hash names a whole path from the start of a prompt, so a set of them is a prefix tree flattened: a prompt's
shared prefix with an instance is the run of its leading hashes found in that instance's set. Each instance's own
set is bounded (least recently routed dropped first, `capacity` hashes) and emptied when the instance's `epoch`
changes (its caches were emptied) or it goes away. The reported hashes are replaced with each heartbeat; the set the
router matches against is the union of both.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from fleet.contract import InstanceRecord


@dataclass(slots=True)
class _Picture:
    epoch: str
    routed: OrderedDict[str, None] = field(default_factory=OrderedDict)  # least recently routed first
    reported: frozenset[str] = frozenset()


class PrefixIndex:
    """Per instance id: the chunk hashes it is believed to hold; `match` counts a prompt's leading hashes found."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._pictures: dict[str, _Picture] = {}

    def _picture(self, record: InstanceRecord) -> _Picture:
        """The instance's picture, emptied if its epoch changed, its reported hashes brought up to its last report."""
        report = record.report
        picture = self._pictures.get(report.instance_id)
        if picture is None or picture.epoch != report.epoch:
            picture = self._pictures[report.instance_id] = _Picture(report.epoch)
        picture.reported = frozenset(report.cached_prefixes)
        return picture

    def match(self, record: InstanceRecord, hashes: list[str]) -> int:
        """How many of `hashes` (a prompt's, in order) the instance holds, counted from the first."""
        picture = self._picture(record)
        matched = 0
        for h in hashes:
            if h not in picture.routed and h not in picture.reported:
                break
            matched += 1
        return matched

    def routed(self, record: InstanceRecord, hashes: list[str]) -> None:
        """A prompt with `hashes` was sent to the instance: they become its most recently routed."""
        if self.capacity <= 0:
            return
        routed = self._picture(record).routed
        for h in reversed(hashes):  # the first chunk last: a prompt's prefixes outlive its longer ones
            routed[h] = None
            routed.move_to_end(h)
        while len(routed) > self.capacity:
            routed.popitem(last=False)

    def forget(self, instance_id: str) -> None:
        """The instance went away: nothing of it is kept."""
        self._pictures.pop(instance_id, None)

    def size(self, instance_id: str) -> int:
        """The hashes this router itself recorded for the instance (for tests and the router's status)."""
        picture = self._pictures.get(instance_id)
        return len(picture.routed) if picture else 0

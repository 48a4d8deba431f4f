"""The lake's journal on its own: a plan committed, crashed at every step, rolled back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors import schema
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import FileFormat, LakeFiles
from sinks.lake.journal import Journal, Plan, empty_op, intent_of, needs_sync, place_op
from sinks.lake.state import LakeState, new_marker
from sinks.store.objects import LakeStore
from tests.sinks.lake.lake_frames import history_frame, window
from tests.sinks.lake.stores import Crash, Crasher

PART = "hist/date=2024-03-01"
KIND = schema.KIND_TAG_HISTORY


def journal_at(root: Path, store: LakeStore | None = None) -> Journal:
    store = store or LakeStore(str(root))
    files = LakeFiles(store, grace_s=60.0, decoded_rows=1_000)
    datasets = DatasetFacts(store, lake="lake", partition="date")
    return Journal(store, LakeState(store), files, datasets, FileFormat())


def rows(tag: str, start_h: int, end_h: int) -> pa.Table:
    frame = history_frame([tag], window(start_h, end_h), step_s=3600)
    return schema.table_from_frame(frame, KIND)


def metadata(journal: Journal, *owners: tuple[str, str]) -> dict[bytes, bytes]:
    return journal.datasets.file_metadata("hist", KIND, list(owners))


def marker(chunk: str, files: dict[str, int]) -> dict[str, Any]:
    return new_marker(
        flow="f",
        dataset="hist",
        kind=KIND,
        chunk_id=chunk,
        window=window(0, 3),
        members=["/a"],
        files=[{"path": p, "rows": r} for p, r in files.items()],
        rows_fetched=sum(files.values()),
        rows_committed=sum(files.values()),
    )


def seed(journal: Journal) -> None:
    """Two chunks' files: `old` (3 rows of /a) and `gone` (2 rows of /c), with markers."""
    plan = Plan(ident="seed", dataset="hist")
    for chunk, table in (("old", rows("/a", 0, 3)), ("gone", rows("/c", 0, 2))):
        dest = f"{PART}/part-{chunk}.parquet"
        temp = journal.stage(plan, table, dest, metadata(journal, ("f", chunk)))
        plan.ops.append(place_op(temp, dest, [("f", chunk)], None))
        journal.state.write_marker(marker(chunk, {dest.split("/", 1)[1]: table.num_rows}))
    journal.commit(plan)


def plan_b(journal: Journal) -> Plan:
    """Chunk B: a new file, `old` rewritten to its first row, `gone` emptied."""
    listed = {e.name: e for e in journal.store.listdir(journal.store.path(PART))}
    plan = Plan(ident="B", dataset="hist")
    new = f"{PART}/part-B.parquet"
    temp = journal.stage(plan, rows("/b", 0, 2), new, metadata(journal, ("f", "B")))
    plan.ops.append(place_op(temp, new, [("f", "B")], None))
    old = f"{PART}/part-old.parquet"
    kept = rows("/a", 0, 1)
    temp = journal.stage(plan, kept, old, metadata(journal, ("f", "old")))
    plan.ops.append(place_op(temp, old, [("f", "old")], listed["part-old.parquet"]))
    plan.ops.append(empty_op(f"{PART}/part-gone.parquet", [("f", "gone")]))
    plan.update(("f", "old"), add={old.split("/", 1)[1]: 1})
    plan.update(("f", "gone"), remove=[f"{PART}/part-gone.parquet".split("/", 1)[1]])
    plan.marker = marker("B", {new.split("/", 1)[1]: 2})
    return plan


def snapshot(root: Path) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """Each data file's (tag, ts) rows, and each marker's files."""
    files = {
        p.name: sorted(
            zip(*pq.read_table(p, columns=["tag", "ts"]).to_pydict().values(), strict=True)
        )
        for p in sorted((root / PART).glob("*.parquet"))
    }
    markers = {
        p.stem: orjson.loads(p.read_bytes())["files"]
        for p in sorted((root / "_historian/_flows/f/markers").glob("*.json"))
    }
    return files, markers


def test_a_commit_places_empties_repoints_markers_and_leaves_no_intent(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    seed(journal)
    journal.commit(plan_b(journal))
    files, markers = snapshot(tmp_path)
    assert {name: len(found) for name, found in files.items()} == {
        "part-B.parquet": 2,
        "part-gone.parquet": 0,
        "part-old.parquet": 1,
    }
    assert markers == {
        "B": [{"path": "date=2024-03-01/part-B.parquet", "rows": 2}],
        "gone": [],
        "old": [{"path": "date=2024-03-01/part-old.parquet", "rows": 1}],
    }
    assert not list((tmp_path / "_historian/hist/pending").iterdir())
    assert not list((tmp_path / "_historian/hist/tmp").iterdir())


def test_a_crash_at_every_step_of_a_commit_recovers_to_before_or_after(
    tmp_path: Path,
) -> None:
    reference = journal_at(tmp_path / "reference")
    seed(reference)
    before = snapshot(tmp_path / "reference")
    reference.commit(plan_b(reference))
    after = snapshot(tmp_path / "reference")
    crasher = Crasher(("replace", "copy_over", "remove", "write_json", "sync_dir"))
    outcomes = []
    for step in range(1, 30):
        root = tmp_path / f"crash{step}"
        journal = journal_at(root, crasher.store(str(root)))
        seed(journal)
        plan = plan_b(journal)
        crasher.arm(step)
        try:
            journal.commit(plan)
        except Crash:
            crashed = True
        else:
            crashed = False
        finally:
            crasher.disarm()
        if not crashed:
            break
        journal_at(root).recover("hist")
        got = snapshot(root)
        assert got in (before, after), f"crash at step {step}"
        outcomes.append(got == after)
        assert not list((root / "_historian/hist/pending").iterdir())
        assert not list((root / "_historian/hist/tmp").iterdir())
    else:
        pytest.fail("the commit never completed")
    assert set(outcomes) == {False, True}, "crashes before and after the intent"
    assert step > 6


def test_a_lost_staged_file_rolls_back_and_forgets_every_touched_chunk(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    seed(journal)
    plan = plan_b(journal)
    intent = intent_of(plan)
    path = journal.store.path("_historian/hist/pending/B.json")
    journal.store.write_json(path, intent)
    journal.store.replace(
        journal.store.path(intent["ops"][0]["tmp"]), str(tmp_path / PART / "part-B.parquet")
    )
    for temp in (tmp_path / "_historian/hist/tmp").iterdir():
        temp.unlink()  # the rewrite of `old` is lost: the intent cannot be finished
    journal_at(tmp_path).recover("hist")
    files, markers = snapshot(tmp_path)
    assert "part-B.parquet" not in files, "a new file the intent placed is removed"
    assert len(files["part-old.parquet"]) == 3, "a file it had not replaced yet is kept"
    assert markers == {}, "B, old and gone are fetched again"
    assert not (tmp_path / "_historian/hist/pending/B.json").exists()


def test_recovery_of_object_storage_takes_over_only_stale_intents(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    seed(journal)
    plan = plan_b(journal)
    path = journal.store.path("_historian/hist/pending/B.json")
    journal.store.write_json(path, intent_of(plan))
    journal.recover("hist", min_age_s=60.0)  # another process may be applying it now
    assert (tmp_path / "_historian/hist/pending/B.json").exists()
    assert len(list((tmp_path / "_historian/hist/tmp").iterdir())) == 2
    journal.recover("hist")
    assert snapshot(tmp_path)[0]["part-B.parquet"]


def test_a_torn_intent_is_dropped_as_never_begun(tmp_path: Path) -> None:
    journal = journal_at(tmp_path)
    pending = tmp_path / "_historian/hist/pending"
    pending.mkdir(parents=True)
    (pending / "X.json").write_bytes(b'{"id": "X", "ops": [')
    journal.recover("hist")
    assert not list(pending.iterdir())


@pytest.mark.parametrize(
    ("ops", "updates", "synced"),
    [
        ([{"op": "place", "new": True}], False, False),
        ([{"op": "place", "new": False}], False, True),
        ([{"op": "place", "new": True}, {"op": "empty"}], False, True),
        ([{"op": "place", "new": True}], True, True),
    ],
)
def test_only_intents_that_change_earlier_files_or_markers_wait_for_the_disk(
    ops: list[dict[str, Any]], updates: bool, synced: bool
) -> None:
    intent = {"ops": ops, "marker_updates": [{"flow": "f"}] if updates else []}
    assert needs_sync(intent) is synced

"""Expired files are pruned, row and content; an active batch's input stays; a batch's output files expire after
PANTHEON_BATCH_OUTPUT_RETENTION_DAYS and the batch's reference to a pruned one is cleared."""

import os
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from batches.file_retention import prune_expired_files
from batches.models import Batch, BatchStatus, FilePurpose, StoredFile

pytestmark = pytest.mark.django_db


@pytest.fixture
def files_dir(tmp_path):
    with override_settings(PANTHEON_FILES_DIR=tmp_path):
        yield tmp_path


@pytest.fixture
def prune(django_capture_on_commit_callbacks):
    """prune_expired_files, with what it does after its transactions commit (the content's removal) done."""

    def run():
        with django_capture_on_commit_callbacks(execute=True):
            return prune_expired_files()

    return run


def _file(files_dir, purpose=FilePurpose.BATCH, *, expires_in_s: float | None, age_days: float = 0) -> StoredFile:
    now = timezone.now()
    expires_at = None if expires_in_s is None else now + timedelta(seconds=expires_in_s)
    stored = StoredFile.objects.create(filename="in.jsonl", purpose=purpose, bytes=3, expires_at=expires_at,
                                       created_at=now - timedelta(days=age_days))  # fmt: skip
    (files_dir / stored.id).write_bytes(b"{}\n")
    return stored


def _batch(input_file: StoredFile, status: str, **files) -> Batch:
    return Batch.objects.create(endpoint="/v1/chat/completions", input_file=input_file, status=status,
                                expires_at=timezone.now() + timedelta(hours=24), **files)  # fmt: skip


def test_an_expired_file_goes_with_its_content_and_an_unexpired_one_stays(files_dir, prune):
    expired = _file(files_dir, expires_in_s=-1)
    later = _file(files_dir, expires_in_s=3600)
    forever = _file(files_dir, expires_in_s=None)
    done = prune()
    assert done.deleted == [expired.id]
    assert set(StoredFile.objects.values_list("id", flat=True)) == {later.id, forever.id}
    assert sorted(p.name for p in files_dir.iterdir()) == sorted([later.id, forever.id])


def test_an_active_batchs_input_is_kept_past_its_expiry_and_goes_once_the_batch_ends(files_dir, prune):
    read = _file(files_dir, expires_in_s=-1)
    batch = _batch(read, BatchStatus.IN_PROGRESS)
    assert prune().kept == [read.id]
    assert (files_dir / read.id).exists() and StoredFile.objects.filter(pk=read.id).exists()
    Batch.objects.filter(pk=batch.pk).update(status=BatchStatus.COMPLETED)
    # Ended, the batch no longer reads it: it goes, and the batch keeps naming it as its input (as OpenAI's does).
    assert prune().deleted == [read.id]
    assert not (files_dir / read.id).exists()
    assert Batch.objects.get(pk=batch.pk).input_file_id == read.id


def test_a_batchs_output_files_expire_after_the_retention_and_the_batch_forgets_them(files_dir, prune):
    source = _file(files_dir, expires_in_s=None)
    old_output = _file(files_dir, FilePurpose.BATCH_OUTPUT, expires_in_s=None, age_days=31)
    old_errors = _file(files_dir, FilePurpose.BATCH_OUTPUT, expires_in_s=None, age_days=31)
    new_output = _file(files_dir, FilePurpose.BATCH_OUTPUT, expires_in_s=None, age_days=1)
    old_batch = _batch(source, BatchStatus.COMPLETED, output_file=old_output, error_file=old_errors)
    new_batch = _batch(source, BatchStatus.COMPLETED, output_file=new_output)
    done = prune()  # PANTHEON_BATCH_OUTPUT_RETENTION_DAYS: 30 by default
    assert sorted(done.deleted) == sorted([old_output.id, old_errors.id]) and done.stamped == 3
    old_batch.refresh_from_db()
    assert (old_batch.output_file_id, old_batch.error_file_id) == (None, None)
    new_output.refresh_from_db()
    assert new_output.expires_at == new_output.created_at + timedelta(days=30)  # shown by the Files API
    assert Batch.objects.get(pk=new_batch.pk).output_file_id == new_output.id
    assert not (files_dir / old_output.id).exists() and (files_dir / new_output.id).exists()


def test_with_no_output_retention_output_files_are_kept(files_dir, prune):
    old_output = _file(files_dir, FilePurpose.BATCH_OUTPUT, expires_in_s=None, age_days=400)
    with override_settings(PANTHEON_BATCH_OUTPUT_RETENTION_DAYS=0):
        assert prune().deleted == []
    assert StoredFile.objects.get(pk=old_output.pk).expires_at is None


def test_content_no_row_names_goes_once_its_grace_has_passed_and_files_being_written_stay(files_dir, prune):
    """What a crash leaves (content whose row a prune deleted before its unlink, an upload's or a finalize's draft)
    is removed; a fresh draft (being written now) and every file a row names stay."""
    named = _file(files_dir, expires_in_s=None)
    two_hours_ago = (timezone.now() - timedelta(hours=2)).timestamp()
    leftovers = {"file-gone": b"{}\n", ".upload-abc123": b"{}\n", ".file-out.123": b"{}\n"}
    for name, content in leftovers.items():
        (files_dir / name).write_bytes(content)
        os.utime(files_dir / name, (two_hours_ago, two_hours_ago))
    os.utime(files_dir / named.id, (two_hours_ago, two_hours_ago))
    (files_dir / ".upload-now").write_bytes(b"{")  # an upload being written
    done = prune()
    assert sorted(done.orphans) == sorted(leftovers)
    assert sorted(p.name for p in files_dir.iterdir()) == sorted([named.id, ".upload-now"])

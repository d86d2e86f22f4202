"""The dataset check, the pipeline's first state after the input's (constructs/pipeline/dataset_check.py), executed in
the emulated pipeline (dev, Batch): a dataset must hold prepare_data.py's manifest before anything is claimed or
submitted. The emulated bucket holds the prepared dataset `tests.sfn_emulator.PREPARED_DATASET`."""

import pytest

from tests.pipeline.runs import ACCEPTED, RUN, messages
from tests.sfn_emulator import PREPARED_DATASET

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)


def _nothing_claimed_or_submitted(emulator) -> None:
    assert emulator.submitted == []
    listed = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="runs/").get("KeyCount", 0)
    assert listed == 0


def test_a_dataset_that_was_never_prepared_is_refused_before_any_job(emulator):
    result = emulator.run({**RUN, "run_id": "typo-1", "dataset": "datasets/wikitxt/"})
    assert result["status"] == "FAILED" and result.get("error") == "DatasetNotPrepared", result
    assert "datasets/wikitxt/ is not prepared: no readable datasets/wikitxt/dataset.json" in result["cause"]
    _nothing_claimed_or_submitted(emulator)
    (alert,) = messages(emulator)
    assert alert["state"] == "CheckDataset" and alert["detail"] == "S3.NoSuchKeyException"


def test_a_folder_of_shards_without_its_manifest_is_not_prepared(emulator):
    # prepare_data.py writes dataset.json last: shards alone are an interrupted or hand-made upload.
    emulator.s3.put_object(Bucket=emulator.bucket, Key="datasets/partial/train_000000.bin", Body=b"\0" * 64)
    result = emulator.run({**RUN, "run_id": "partial-1", "dataset": "datasets/partial/"})
    assert result.get("error") == "DatasetNotPrepared", result
    _nothing_claimed_or_submitted(emulator)


def test_a_manifest_that_is_not_json_is_not_prepared(emulator):
    emulator.s3.put_object(Bucket=emulator.bucket, Key="datasets/broken/dataset.json", Body=b"{truncated")
    result = emulator.run({**RUN, "run_id": "broken-1", "dataset": "datasets/broken/"})
    assert result.get("error") == "DatasetNotPrepared", result
    _nothing_claimed_or_submitted(emulator)


def test_the_dataset_may_be_named_without_its_trailing_slash(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run({**RUN, "run_id": "no-slash-1", "dataset": PREPARED_DATASET.rstrip("/")})
    assert result["status"] == "SUCCEEDED", result

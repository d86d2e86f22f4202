"""The run's dataset must be prepared before any instance starts: `<dataset>/dataset.json` must exist and be JSON.

prepare_data.py (`make dataset`, `launch.py prepare-data`) writes that manifest last, beside the shards, so its
presence means a complete dataset; a typo or an unprepared folder would otherwise boot every node and pass the
sanity check before the training job's own preflight refused it. The read retries throttling and 5xx like the
pipeline's other calls; any other failure (S3.NoSuchKeyException: API_GetObject; or a manifest that is not JSON)
fails the run as DatasetNotPrepared through the failure path, naming the dataset.
"""

import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import DATASET_MANIFEST, DATASETS_PREFIX
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient
from constructs.pipeline.failure_path import FailurePath

J = sfn.JsonPath
DATASET_NOT_PREPARED = "DatasetNotPrepared"
MANIFEST = DATASET_MANIFEST


def dataset_check(scope: Construct, *, bucket: s3.IBucket, failures: FailurePath) -> tuple[sfn.Pass, sfn.Pass]:
    """(start, checked): `start` takes the validated input ({"run"}); a prepared dataset goes on at `checked`."""
    # The dataset may be written with or without its trailing '/' (contracts.run.DATASET_PATTERN).
    manifest = sfn.Pass.jsonata(
        scope,
        "DatasetManifest",
        outputs={
            "run": "{% $states.input.run %}",
            "manifest": "{% $states.input.run.dataset & ($substring($states.input.run.dataset, -1) = '/' ? '' : '/') "
            f"& '{MANIFEST}' %}}",
        },
    )
    read = tasks.CallAwsService(
        scope,
        "CheckDataset",
        service="s3",
        action="getObject",
        iam_action="s3:GetObject",
        iam_resources=[bucket.arn_for_objects(f"{DATASETS_PREFIX}*/{MANIFEST}")],
        parameters={"Bucket": bucket.bucket_name, "Key": J.string_at("$.manifest")},
        result_selector={"manifest.$": "States.StringToJson($.Body)"},  # not JSON: a States.Runtime error, caught
        result_path=J.DISCARD,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(read)
    refused = sfn.Pass(
        scope,
        "OnCheckDatasetFailure",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "CheckDataset",
                "error": DATASET_NOT_PREPARED,
                "detail.$": "$.caught.Error",
                "cause": J.format(
                    "dataset {} is not prepared: no readable {} in the data bucket; prepare it with make dataset "
                    "(the output of prepare_data.py) or name a prepared one",
                    J.string_at("$.run.dataset"),
                    J.string_at("$.manifest"),
                ),
            },
        },
    )
    read.add_catch(refused.next(failures.notify), errors=["States.ALL"], result_path="$.caught")
    checked = sfn.Pass(scope, "DatasetPrepared", parameters={"run.$": "$.run"})
    manifest.next(read).next(checked)
    return manifest, checked

"""The job-state metrics count every queue the Batch stack creates: the expected set is read from the synthesized
Batch template (every AWS::Batch::JobQueue), never written here, so a queue added later cannot be forgotten."""

import json

import pytest

from tests.alone import StacksAlone


def _queue_name(arn: object) -> str:
    # The rule names each queue by an ARN formatted from its fixed name (arn:...:job-queue/<name>).
    return json.dumps(arn).split("job-queue/")[1].split('"')[0]


# With and without the Spot single-node queue's on-demand twin: the rule listens to exactly the queues that exist.
@pytest.mark.parametrize(("spot", "queues"), [("true", 3), ("false", 2)])
def test_job_state_rule_listens_to_every_queue_the_batch_stack_creates(spot, queues):
    environment = StacksAlone(batch_single_node_spot=spot)
    observability, compute = environment.observability(), environment.compute()
    created = {
        queue["Properties"]["JobQueueName"]
        for queue in environment.template(compute).find_resources("AWS::Batch::JobQueue").values()
    }
    (rule,) = environment.template(observability).find_resources("AWS::Events::Rule").values()
    listened = [_queue_name(arn) for arn in rule["Properties"]["EventPattern"]["detail"]["jobQueue"]]
    assert sorted(listened) == sorted(created) and len(created) == queues

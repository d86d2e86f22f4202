"""Run the synthesized pipeline state machine in moto's Amazon States Language interpreter.

`Emulator` (a context manager, inside `mock_aws`) patches as little as it can, each patch undone on exit:

1. Resolves the CloudFormation intrinsics in the DefinitionString (Fn::Join, Ref, Fn::GetAtt,
   Fn::ImportValue, Fn::GetStackOutput, Fn::Sub of pseudo parameters) to emulated resources: a referenced SNS
   topic, S3 bucket, DynamoDB table (its key schema from the template), Batch queue or job definition is created in
   moto and its name/ARN substituted. Queues and
   job definitions the pipeline names instead of referencing (their fixed names) are created from the Batch
   stack's template first, as `cdk deploy` creates them before the pipeline.
2. Works around moto 5.2.1's Batch integration, which hands Step Functions' PascalCase request
   to boto unchanged (KeyError) and expects PascalCase back (AWS_FACTS.md): a client proxy maps
   `submit_job`'s request onto boto's member names (using botocore's own shape, so the
   `Parameters`/`Tags` maps keep their keys) and adds `JobId`/`JobName`/`Status` to responses.
   The same proxy reads S3 `getObject`'s Body into a string, as the real aws-sdk integration does, and
   translates the PascalCase of Step Functions' aws-sdk integration to and from camelCase APIs (Step Functions).
3. Decides each Batch job's outcome: moto's non-Docker Batch backend finishes every job at submit
   time (success, or failure for all with MOTO_SIMPLE_BATCH_FAIL_AFTER); `outcomes[kind]` (a list of
   booleans, one per submission) replaces that decision, and a succeeding validate job writes its
   verdict to s3://<bucket>/runs/<run_id>/verdict.json like the real one.
4. Lets a retried `.sync` task wait again: moto interrupts a Task's callback endpoint when an attempt
   ends and reuses that endpoint for the Retry attempt, which then reports States.Timeout at once.
   The interruption is cleared before each attempt (no task-token callback ever arrives here).
5. Records instead of sleeping: moto's Retrier really calls time.sleep(interval) — minutes in the
   real definition — so the retrier module's `time` is replaced by a recorder of the intervals; a Wait state's
   seconds are recorded in `waits` the same way.
6. Copies a state machine without its executions: moto deep-copies the state machine (and through it the
   whole backend) at every StartExecution, and an execution holds locks that cannot be copied. So runs can
   follow each other and overlap in one test; `forget_executions` still clears them between tests. Parsing
   a definition is serialized: moto's parser keeps its query-language scopes in a list shared by all threads,
   so two executions starting together with a JSONata state could read each other's scope. It is also done
   once per definition: moto parses at every StartExecution (about a second of ANTLR for the pipeline); each
   execution gets a deep copy of the parsed program, as fresh as a new parse, so nothing one execution does
   to the program's components can reach another. Two more things moto does at every call are done once: a JSONPath
   is parsed once per string (jsonpath_ng builds its yacc parser at each parse) and a service's client is made
   once per region (moto's integrations make a client per task; the calls stay theirs, through the proxy).
7. Evaluates JSONata states with jsonata-python (a port of jsonata-java; moto's own bridge needs a JVM), and
   names AWS SDK integration errors as Step Functions does, `ServiceName.ErrorName` in PascalCase
   (https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html: "S3.NoSuchKeyException";
   moto 5.2.1 knows the casing of DynamoDb and Sfn only and would say "s3.NoSuchKeyException"); a modeled error whose
   shape ends in Fault (CloudWatch's InternalServiceFault) is named after the Java SDK's class, `...Exception`, as
   Step Functions names it ("CloudWatch.InternalServiceException"), not moto's "...FaultException". Its optimized
   DynamoDB integration already names errors `DynamoDB.<code>` ("DynamoDB.ConditionalCheckFailedException"), the
   prefix Step Functions documents for it (https://docs.aws.amazon.com/step-functions/latest/dg/connect-ddb.html,
   "Exception prefix differences"): nothing to rename there; its client gets the proxy like the others.
8. Checks every request a service integration sends (tests/request_validator.py): moto's integration clients skip
   botocore's validation (parameter_validation=False), so a hook on each client runs it (unknown and required
   members, types, minimums) and the walker that adds what botocore leaves out (enums, full-match patterns, the
   maximums of strings, lists and numbers). A refused request fails its call before moto sees it, is recorded in
   `refused_requests`, and `wait` raises it when the execution ends, whatever the definition made of the failure.
9. Injects transient faults: `faults["s3.get_object"] = ["SlowDown"]` makes the next such call fail with that
   error code (and its HTTP status), one entry per call, before moto sees it; `"after:InternalError"` lets the
   call take effect first and then loses its answer, as a timeout after a successful write does. DynamoDB too:
   `faults["dynamodb.put_item"] = ["after:InternalServerError"]`; its conditional writes (put_item, update_item,
   delete_item) are serialized, as DynamoDB decides a condition and the write atomically and moto checks, then writes.
"""

import copy
import functools
import json
import re
import threading
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import boto3
import jsonata
import moto.batch_simple.models as batch_simple
import moto.stepfunctions.parser.asl.component.common.path.result_path as result_path
import moto.stepfunctions.parser.asl.component.common.retry.retrier_decl as retrier_decl
import moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_aws_sdk as sdk_service
import moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch as batch_service
import moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_dynamodb as ddb_service
import moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sns as sns_service
import moto.stepfunctions.parser.asl.jsonata.jsonata as jsonata_bridge
import moto.stepfunctions.parser.asl.parse.asl_parser as asl_parser
import moto.stepfunctions.parser.asl.utils.json_path as json_path
from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction

from tests.request_validator import check

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/pipeline-test"
JOB_KINDS = ("sanity", "train", "validate")
PREPARED_DATASET = "datasets/wikitext/"  # every emulated bucket holds this dataset's manifest
# A Batch job cancelled by its queue's time limit while it waited for instances: its StatusReason as the Batch user
# guide gives it ("Jobs stuck in RUNNABLE due to capacity").
BATCH_NO_CAPACITY = "no-capacity"
BATCH_CAPACITY_CANCEL = "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
# A job whose last attempt lost its host (a Spot reclaim): the attempt's StatusReason (Batch user guide, "Automated job
# retries"; the job definitions' HOST_LOST rule).
BATCH_HOST_LOST = "host-lost"
HOST_LOST_REASON = "Host EC2 (instance i-0123456789abcdef0) terminated."
# Transient error codes and their HTTP status, as the services return them.
FAULT_STATUS = {
    "SlowDown": 503,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "ThrottlingException": 400,
    "Throttling": 400,
    "InternalFailure": 500,
    # DynamoDB developer guide, "Error handling with DynamoDB": a 500 for InternalServerError, 400 for throttling.
    "InternalServerError": 500,
    "ProvisionedThroughputExceededException": 400,
}
CAMEL_CASE_SERVICES = ("stepfunctions", "eks", "batch")
ERROR_SERVICE_NAMES = {"s3": "S3", "ssm": "Ssm", "sns": "Sns", "sfn": "Sfn", "dynamodb": "DynamoDb", "eks": "Eks",
                       "cloudwatch": "CloudWatch", "autoscaling": "AutoScaling",
                       "sagemaker": "SageMaker", "batch": "Batch"}  # fmt: skip


def _to_boto(value, shape):
    """Step Functions' PascalCase request -> boto member names, following botocore's input shape."""
    if shape.type_name == "structure" and isinstance(value, dict):
        members = {name.lower(): name for name in shape.members}
        return {
            members.get(k.lower(), k): _to_boto(v, shape.members[members[k.lower()]]) if k.lower() in members else v
            for k, v in value.items()
        }
    if shape.type_name == "list" and isinstance(value, list):
        return [_to_boto(item, shape.member) for item in value]
    return value  # maps (Parameters, Tags) and scalars unchanged


def _to_pascal(value, shape):
    """A camelCase API's response as Step Functions' AWS SDK integration returns it: every structure member's name
    in PascalCase, at every depth (`$.Nodegroup.ScalingConfig.DesiredSize`); map keys (labels, tags) unchanged."""
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {key[:1].upper() + key[1:]: _to_pascal(item, shape.members.get(key)) for key, item in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_to_pascal(item, shape.member) for item in value]
    return value


def _json_safe(value):
    if isinstance(value, StreamingBody):
        return value.read().decode()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


_ABSENT = object()


def _copy_without_executions(machine, memo):
    clone = machine.__class__.__new__(machine.__class__)
    memo[id(machine)] = clone
    for name, value in machine.__dict__.items():
        setattr(clone, name, [] if name == "executions" else copy.deepcopy(value, memo))
    return clone


class _ClientProxy:
    """A boto client as Step Functions' own integrations would see it (see the module docstring)."""

    def __init__(self, client, recorder: "Emulator"):
        self._client, self._recorder = client, recorder

    def _atomic(self, method):
        def call(**request):
            with self._recorder._lock:
                return method(**request)

        return call

    def __getattr__(self, name):
        method = getattr(self._client, name)
        service = self._client.meta.service_model.service_name
        fault = self._recorder.next_fault(f"{service}.{name}")
        answer = self._recorder.next_answer(f"{service}.{name}")
        if fault is None and answer is not None:  # an operation moto lacks: the request checked, a recorded answer

            def answered(**request):
                operation = self._client.meta.method_to_api_mapping[name]
                shape = self._client.meta.service_model.operation_model(operation).input_shape
                self._recorder.check_request(service, operation, _to_boto(request, shape) if shape else request)
                return _json_safe(answer)

            return answered
        if fault is not None:
            # "after:Code": the call takes effect, then its answer is lost (the caller sees Code and may retry).
            code, lost_reply = (fault[len("after:") :], True) if fault.startswith("after:") else (fault, False)

            def failing(**request):
                operation = self._client.meta.method_to_api_mapping[name]
                shape = self._client.meta.service_model.operation_model(operation).input_shape
                self._recorder.check_request(service, operation, _to_boto(request, shape) if shape else request)
                if lost_reply:
                    getattr(self._recorder._raw(service), name)(**request)
                raise ClientError(
                    {
                        "Error": {"Code": code, "Message": f"injected {code}"},
                        "ResponseMetadata": {"HTTPStatusCode": FAULT_STATUS.get(code, 500), "RequestId": "injected"},
                    },
                    name,
                )

            return failing
        if service == "batch" and name == "submit_job":

            def submit_job(**request):
                shape = self._client.meta.service_model.operation_model("SubmitJob").input_shape
                request = _to_boto(request, shape)
                self._recorder.submitted.append(request)
                response = method(**request)
                return {
                    **response,
                    "JobId": response["jobId"],
                    "JobName": response["jobName"],
                    "JobArn": response.get("jobArn"),
                }

            return submit_job
        if service == "batch" and name == "describe_jobs":

            def describe_jobs(**request):
                response = method(**request)
                for job in response["jobs"]:
                    job.update(JobId=job["jobId"], JobName=job["jobName"], Status=job["status"])
                    if "statusReason" in job:
                        job["StatusReason"] = job["statusReason"]
                    # Step Functions' optimized Batch integration returns the job in PascalCase (its ResultSelector
                    # reads $.JobId); the failure Cause carries the attempts with their exit codes the same way.
                    job["Attempts"] = [
                        {
                            "Container": {"ExitCode": a.get("container", {}).get("exitCode")},
                            **({"StatusReason": a["statusReason"]} if "statusReason" in a else {}),
                        }
                        for a in job.get("attempts", [])
                    ]
                return response

            return describe_jobs
        if service == "s3" and name == "get_object":
            return lambda **request: _json_safe(method(**request))
        if service in CAMEL_CASE_SERVICES:  # Step Functions speaks PascalCase to them both ways

            def pascal_case_call(**request):
                operation = self._client.meta.service_model.operation_model(
                    self._client.meta.method_to_api_mapping[name]
                )
                response = method(**_to_boto(request, operation.input_shape))
                return _to_pascal(_json_safe(response), operation.output_shape)

            return pascal_case_call
        if service == "dynamodb" and name in ("put_item", "update_item", "delete_item"):
            return self._atomic(method)
        if service == "s3" and name == "put_object":

            def put_object(**request):
                with self._recorder._lock:  # S3 decides conditional writes atomically; moto checks, then writes
                    return method(**request)

            return put_object
        return method


@dataclass
class Emulator:
    """Create with the pipeline stack's template and the app's templates (for cross-stack outputs)."""

    template: dict
    templates: dict[str, dict]
    # kind -> outcome per submission: True/False, an exit code, BATCH_NO_CAPACITY, or a backend emulator's named
    # event (a string)
    outcomes: dict[str, list[bool | int | str]] = field(default_factory=dict)
    verdict: dict | None = None  # written by a succeeding validate job
    submitted: list[dict] = field(default_factory=list)
    retry_sleeps: list[float] = field(default_factory=list)
    physical: dict[str, dict[str, str]] = field(default_factory=dict)  # logical id -> {"Ref": .., "Arn": ..}
    faults: dict[str, list[str]] = field(default_factory=dict)  # "service.operation" -> error codes, one per call
    faulted: list[str] = field(default_factory=list)  # the faults raised, in order
    # kind -> an Event the first job of that kind waits on before it finishes: holds an execution RUNNING
    held: dict[str, threading.Event] = field(default_factory=dict)
    alerts: str = ""  # the URL of an SQS queue subscribed to the alerts topic (subscribe_queue)
    refused_requests: list[str] = field(default_factory=list)  # what the services would refuse, one problem a line
    # "service.operation" -> the answer of an operation moto does not emulate (EC2 DescribeCapacityReservations,
    # SageMaker DescribeTrainingPlan), in the shape of botocore's model; a list: one answer per call, the last repeated
    answers: dict[str, dict | list[dict]] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)  # the seconds of each Wait state passed (recorded, not slept)
    wait_for_real: bool = False  # a test's own state machine that must stay RUNNING a while (reset: False again)
    # kind -> per submission, the host ids its job names bad before it ends, as a training container does
    # (training_image/efa_training/runtime/bad_hosts.py): runs/<run_id>/bad-hosts/pending/<id>
    bad_hosts: dict[str, list[list[str]]] = field(default_factory=dict)

    def record_bad_hosts(self, kind: str, submission: int, run_id: str) -> None:
        named = self.bad_hosts.get(kind, [])
        for host in named[submission] if submission < len(named) else []:
            record = {"host_id": host, "why": "failed the health check after a failed attempt (exit 1)",
                      "evidence": ["Xid 79 on GPU 3"], "run_id": run_id}  # fmt: skip
            self.s3.put_object(
                Bucket=self.bucket, Key=f"runs/{run_id}/bad-hosts/pending/{host}", Body=json.dumps(record).encode()
            )

    def _raw(self, service: str):
        """A plain moto client of `service` (the calls a lost reply lets through)."""
        return boto3.client(service, region_name=REGION)

    def next_answer(self, call: str) -> dict | None:
        """The recorded answer to `call`, if any (a list's next entry; its last entry answers every later call)."""
        answer = self.answers.get(call)
        if isinstance(answer, list):
            return answer.pop(0) if len(answer) > 1 else answer[0]
        return answer

    def next_fault(self, call: str) -> str | None:
        """The error code the next `call` fails with; None (or an entry None) lets it through."""
        queue = self.faults.get(call)
        if not queue:
            return None
        fault = queue.pop(0)
        if fault is not None:
            self.faulted.append(f"{call}:{fault}")
        return fault

    def check_request(self, service: str, operation: str, request: dict) -> None:
        """Fail a request the service would refuse (tests/request_validator.py); `wait` reports it."""
        problems = check(service, operation, request)
        if problems:
            self.refused_requests.extend(problems)
            raise AssertionError(f"{service} {operation} request refused:\n" + "\n".join(problems))

    def __enter__(self) -> "Emulator":
        self._patches: list[tuple[object, str, object]] = []
        original_client = batch_service.boto_client_for
        self._original_client = original_client

        clients: dict[tuple[str, str], object] = {}

        def proxy(region, service, state_credentials=None):
            # One client per region and service: moto's boto_client_for makes the same one whatever a task's
            # credentials (its fixed test keys), and making it is a third of an integration call's cost.
            if (region, service) not in clients:
                client = original_client(region=region, service=service, state_credentials=state_credentials)
                client.meta.events.register(  # every call of this client, with the parameters as the caller gave them
                    "provide-client-params",
                    lambda params, model, **_: self.check_request(model.service_model.service_name, model.name, params),
                )
                clients[region, service] = client
            return _ClientProxy(clients[region, service], self)

        self._patch(batch_service, "boto_client_for", proxy)
        self._patch(sdk_service, "boto_client_for", proxy)
        self._patch(sns_service, "boto_client_for", proxy)
        self._patch(ddb_service, "boto_client_for", proxy)
        self._patch(sdk_service, "_SERVICE_ERROR_NAMES", ERROR_SERVICE_NAMES)
        named = sdk_service.StateTaskServiceAwsSdk._normalise_exception_name

        def java_named(service: str, ex: Exception) -> str:  # a modeled `...Fault` shape: the Java SDK's `...Exception`
            return re.sub(r"Fault(Exception)?$", "Exception", named(service, ex))

        self._patch(sdk_service.StateTaskServiceAwsSdk, "_normalise_exception_name", staticmethod(java_named))
        self._patch(jsonata_bridge, "_eval_jsonata", lambda expression: jsonata.Jsonata(expression).evaluate(None))
        self._patch(retrier_decl, "time", types.SimpleNamespace(sleep=self.retry_sleeps.append))
        for module in (json_path, result_path):  # each parse builds jsonpath_ng's yacc parser anew
            self._patch(module, "parse", functools.lru_cache(maxsize=None)(module.parse))
        slept = WaitFunction._wait_interval

        def wait(function, env, wait_seconds):
            if not self.wait_for_real:
                return self.waits.append(wait_seconds)
            return slept(function, env=env, wait_seconds=wait_seconds)

        self._patch(WaitFunction, "_wait_interval", wait)
        self._patch(batch_simple.BatchSimpleBackend, "_mark_job_as_finished", self._finish_job())
        original_eval_sync = StateTaskServiceCallback._eval_sync

        def eval_sync(task, env, sync_resolver, timeout_seconds, callback_endpoint, heartbeat_endpoint):
            if callback_endpoint is not None and callback_endpoint.get_outcome() is None:
                callback_endpoint._notify_event.clear()  # interrupted by the previous attempt, not notified
            return original_eval_sync(
                task,
                env=env,
                sync_resolver=sync_resolver,
                timeout_seconds=timeout_seconds,
                callback_endpoint=callback_endpoint,
                heartbeat_endpoint=heartbeat_endpoint,
            )

        self._patch(StateTaskServiceCallback, "_eval_sync", eval_sync)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = defaultdict(int)
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.s3 = boto3.client("s3", region_name=REGION)
        self.ssm = boto3.client("ssm", region_name=REGION)
        self.sqs = boto3.client("sqs", region_name=REGION)
        self._create_named_batch_resources()
        # The pipeline: the one state machine with a fixed name (a backend may add others beside it, unnamed).
        machine = next(
            r
            for r in self.template["Resources"].values()
            if r["Type"] == "AWS::StepFunctions::StateMachine" and "StateMachineName" in r["Properties"]
        )
        self.definition = self.resolve(machine["Properties"]["DefinitionString"])
        self.name = machine["Properties"].get("StateMachineName", "pipeline")
        self.new_state_machine()
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        machine_class = type(stepfunctions_parser_backends[ACCOUNT][REGION].state_machines[0])
        self._patch(machine_class, "__deepcopy__", _copy_without_executions)
        parse, parsing = asl_parser.AmazonStateLanguageParser.parse, threading.Lock()
        parsed: dict[str, tuple] = {}

        def parse_once(definition):
            with parsing:
                if definition not in parsed:
                    parsed[definition] = parse(definition)
                program, tree = parsed[definition]
                return copy.deepcopy(program), tree  # each execution gets a program never evaluated before

        self._patch(asl_parser.AmazonStateLanguageParser, "parse", staticmethod(parse_once))
        return self

    def new_state_machine(self) -> str:
        self.state_machine_arn = self.sfn.create_state_machine(
            name=self.name, definition=self.definition, roleArn=ROLE_ARN
        )["stateMachineArn"]
        return self.state_machine_arn

    @staticmethod
    def forget_executions() -> None:
        """moto deep-copies a state machine, and through it its whole backend, at every StartExecution; a
        finished execution holds locks that do not copy. So: forget the finished ones between runs."""
        from moto.stepfunctions.parser.models import stepfunctions_parser_backends

        for machine in stepfunctions_parser_backends[ACCOUNT][REGION].state_machines:
            machine.executions.clear()

    def reset(self) -> None:
        """Forget the previous execution's plan and records (the emulated resources stay)."""
        self.outcomes, self.verdict, self.bad_hosts = {}, None, {}
        self.faults.clear()
        self.answers.clear()
        self.faulted.clear()
        self.refused_requests.clear()
        self.forget_executions()
        self.submitted.clear()
        self.retry_sleeps.clear()
        self.waits.clear()
        self.wait_for_real = False
        self._counts.clear()

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._patches):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

    def _patch(self, owner, name, value) -> None:
        self._patches.append(
            (owner, name, owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name))
        )
        setattr(owner, name, value)

    # ---- job outcomes -------------------------------------------------------------------------
    def _finish_job(self):
        emulator = self

        def finish(backend, include_start_attempt, job):
            backend.backend._jobs[job.job_id] = job
            job.job_started_at = datetime.now()
            job.log_stream_name = job._stream_name
            if include_start_attempt:
                job._start_attempt()
            kind = job.job_name.rsplit("-", 1)[-1]
            with emulator._lock:
                index = emulator._counts[kind]
                emulator._counts[kind] += 1
            if index == 0 and kind in emulator.held:
                emulator.held[kind].wait(timeout=60)
            plan = emulator.outcomes.get(kind, [True])
            outcome = plan[min(index, len(plan) - 1)]
            emulator.record_bad_hosts(kind, index, job.parameters.get("run_id", ""))
            if outcome == BATCH_NO_CAPACITY:  # cancelled in RUNNABLE by its queue's time limit: it never started
                job.attempts, job.latest_attempt = [], None
                job.job_stopped_reason = BATCH_CAPACITY_CANCEL
                job._mark_stopped(success=False)
                return
            if outcome == BATCH_HOST_LOST:  # its instance went away under it: no exit code
                if job.latest_attempt:
                    job.latest_attempt["statusReason"] = HOST_LOST_REASON
                job._mark_stopped(success=False)
                return
            # True/False: succeeded/failed (exit code 1); an int: the main container's exit code (0 succeeds).
            success = outcome is True or (not isinstance(outcome, bool) and outcome == 0)
            job.exit_code = (0 if success else 1) if isinstance(outcome, bool) else int(outcome)
            if job.latest_attempt:
                job.latest_attempt["container"]["exitCode"] = job.exit_code
            if success and kind == "validate" and emulator.verdict is not None:
                run_id = job.parameters["run_id"]
                emulator.s3.put_object(
                    Bucket=emulator.bucket,
                    Key=f"runs/{run_id}/verdict.json",
                    Body=json.dumps(emulator.verdict).encode(),
                )
            job._mark_stopped(success=success)

        return finish

    # ---- resolving the template ---------------------------------------------------------------
    @property
    def bucket(self) -> str:
        return next(v["Ref"] for v in self.physical.values() if v.get("type") == "AWS::S3::Bucket")

    @property
    def runs_table(self) -> str:
        return next(v["Ref"] for v in self.physical.values() if v.get("type") == "AWS::DynamoDB::Table")

    def resolve(self, value, template: dict | None = None):
        template = template or self.template
        if isinstance(value, list):
            return [self.resolve(v, template) for v in value]
        if not isinstance(value, dict):
            return value
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(str(self.resolve(p, template)) for p in parts)
        if "Ref" in value:
            pseudo = {
                "AWS::AccountId": ACCOUNT,
                "AWS::Region": REGION,
                "AWS::Partition": "aws",
                "AWS::URLSuffix": "amazonaws.com",
            }
            return pseudo.get(value["Ref"]) or self._resource(template, value["Ref"])["Ref"]
        if "Fn::GetAtt" in value:
            logical, attribute = value["Fn::GetAtt"]
            return self._resource(template, logical)[attribute]
        if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):  # pseudo parameters only (image URIs)
            return re.sub(
                r"\$\{([^}]+)\}", lambda m: str(self.resolve({"Ref": m.group(1)}, template)), value["Fn::Sub"]
            )
        if "Fn::GetStackOutput" in value:
            ref = value["Fn::GetStackOutput"]
            producer = self.templates[ref["StackName"]]
            return self.resolve(producer["Outputs"][ref["OutputName"]]["Value"], producer)
        if "Fn::ImportValue" in value:
            name = self.resolve(value["Fn::ImportValue"], template)
            for producer in self.templates.values():
                for output in producer.get("Outputs", {}).values():
                    if output.get("Export", {}).get("Name") == name:
                        return self.resolve(output["Value"], producer)
            raise KeyError(f"no stack exports {name}")
        return {k: self.resolve(v, template) for k, v in value.items()}

    def _resource(self, template: dict, logical: str) -> dict[str, str]:
        key = f"{id(template)}/{logical}"
        if key not in self.physical:
            kind = template["Resources"][logical]["Type"]
            name, properties = logical.lower()[:40], template["Resources"][logical].get("Properties", {})
            # A table is made from its template properties (its key schema); every other kind from its name, through
            # `_create`, which a backend's emulator extends as `_create(kind, name)` for its own kinds.
            table = kind == "AWS::DynamoDB::Table"
            created = self._create_table(name, properties) if table else self._create(kind, name)
            self.physical[key] = {"type": kind, **created}
        return self.physical[key]

    def _create(self, kind: str, name: str, properties: dict | None = None) -> dict[str, str]:
        if kind == "AWS::S3::Bucket":
            boto3.client("s3", region_name=REGION).create_bucket(Bucket=name)
            return {"Ref": name, "Arn": f"arn:aws:s3:::{name}"}
        if kind == "AWS::DynamoDB::Table":
            return self._create_table(name, properties or {})
        if kind == "AWS::SNS::Topic":
            arn = boto3.client("sns", region_name=REGION).create_topic(Name=name)["TopicArn"]
            return {"Ref": arn, "TopicArn": arn, "TopicName": name}
        if kind == "AWS::Batch::JobQueue":
            arn = self.create_job_queue(name)
            return {"Ref": arn, "JobQueueArn": arn}
        if kind == "AWS::Batch::JobDefinition":
            arn = self.create_job_definition(name)
            return {"Ref": arn, "JobDefinitionArn": arn}
        raise NotImplementedError(f"the emulator cannot create {kind} ({name})")

    @staticmethod
    def _create_table(name: str, properties: dict) -> dict[str, str]:
        """A DynamoDB table with the key schema and attributes its template declares."""
        arn = boto3.client("dynamodb", region_name=REGION).create_table(
            TableName=name,
            KeySchema=properties["KeySchema"],
            AttributeDefinitions=properties["AttributeDefinitions"],
            BillingMode=properties.get("BillingMode", "PAY_PER_REQUEST"),
        )["TableDescription"]["TableArn"]
        return {"Ref": name, "Arn": arn}

    def _create_named_batch_resources(self) -> None:
        creators = {"AWS::Batch::JobQueue": ("JobQueueName", self.create_job_queue)}
        creators["AWS::Batch::JobDefinition"] = ("JobDefinitionName", self.create_job_definition)
        for template in self.templates.values():
            for resource in template.get("Resources", {}).values():
                name_key, create = creators.get(resource["Type"], (None, None))
                name = resource.get("Properties", {}).get(name_key) if name_key else None
                if create and isinstance(name, str):
                    create(name)

    # Batch: one unmanaged compute environment; every job definition a plain container one (moto's
    # non-Docker backend never runs them, and multi-node overrides play no part in the emulation).
    def create_job_queue(self, name: str) -> str:
        batch = boto3.client("batch", region_name=REGION)
        environments = batch.describe_compute_environments()["computeEnvironments"]
        if environments:
            environment = environments[0]["computeEnvironmentArn"]
        else:
            role = boto3.client("iam", region_name=REGION).create_role(
                RoleName="batch-service", AssumeRolePolicyDocument="{}"
            )["Role"]["Arn"]
            environment = batch.create_compute_environment(
                computeEnvironmentName="emulated",
                type="UNMANAGED",
                state="ENABLED",
                serviceRole=role,
            )["computeEnvironmentArn"]
        return batch.create_job_queue(
            jobQueueName=name,
            state="ENABLED",
            priority=1,
            computeEnvironmentOrder=[{"order": 1, "computeEnvironment": environment}],
        )["jobQueueArn"]

    def create_job_definition(self, name: str) -> str:
        return boto3.client("batch", region_name=REGION).register_job_definition(
            jobDefinitionName=name,
            type="container",
            containerProperties={"image": "training:latest", "vcpus": 1, "memory": 512},
        )["jobDefinitionArn"]

    # ---- running ------------------------------------------------------------------------------
    def subscribe_queue(self, topic_arn: str) -> str:
        url = self.sqs.create_queue(QueueName="alerts")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        boto3.client("sns", region_name=REGION).subscribe(
            TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
        )
        return url

    def run(self, execution_input: dict, name: str | None = None, timeout: float = 20.0) -> dict:
        self._runs = getattr(self, "_runs", 0) + 1
        name = name or f"run-{self._runs}"
        arn = self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(execution_input)
        )["executionArn"]
        return self.wait(arn, timeout)

    def wait(self, execution_arn: str, timeout: float = 20.0) -> dict:
        """The execution once it has ended. Asked at growing intervals (5 ms to 0.1 s): each answer costs moto
        about as much as a state, so asking less often leaves the execution's thread the interpreter."""
        deadline, pause = time.monotonic() + timeout, 0.005
        while True:
            described = self.sfn.describe_execution(executionArn=execution_arn)
            if described["status"] != "RUNNING":
                if self.refused_requests:
                    raise AssertionError("requests a service would refuse:\n" + "\n".join(self.refused_requests))
                return described
            if time.monotonic() > deadline:
                raise TimeoutError(f"{execution_arn} still RUNNING after {timeout}s")
            time.sleep(pause)
            pause = min(2 * pause, 0.1)

    def history(self, execution_arn: str) -> list[dict]:
        return self.sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]

    def submitted_kinds(self) -> list[str]:
        return [request["jobName"].rsplit("-", 1)[-1] for request in self.submitted]

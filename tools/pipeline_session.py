"""The operator CLI's access to AWS and to cdk.json: one environment's deployed pipeline (its stack outputs and
clients), boto3 calls whose errors become one line, and the environment's settings. tools/pipeline_cli.py (the entry
point), tools/pipeline_watch.py, tools/pipeline_describe.py and tools/dataset.py build on it.
"""

import functools
import json
from pathlib import Path

from config.layout import RUNS_TABLE_OUTPUT, stack_name
from contracts import run as schema

# Every AWS client: bounded waits and a few retries, so an endpoint that accepts and never answers costs about
# 3 attempts x 8 s of reading (5 s to connect) before one line says so, well within a minute (botocore "Config":
# connect_timeout, read_timeout, retries; standard mode retries timeouts, throttling and 5xx with backoff).
ATTEMPTS = 3


def client_config():
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=8, retries={"max_attempts": ATTEMPTS, "mode": "standard"})


ROOT = Path(__file__).resolve().parent.parent
# The states a successful run passes through, in order: the stack output `Phases` wins; older stacks had no such
# output, a sanity job and no Compile state.
STAGES = schema.phases(sanity_in_training=False)
RESULT_CODES = {"SUCCEEDED": 0, "RUNNING": 1, "FAILED": 1, "TIMED_OUT": 1, "ABORTED": 1, "PENDING_REDRIVE": 1}


class CliError(Exception):
    """One line for the operator; exit code 2."""


# ---- AWS access --------------------------------------------------------------------------------


def _environment(env: str) -> dict:
    environments = json.loads((ROOT / "cdk.json").read_text())["context"]["environments"]
    if env not in environments:
        raise CliError(f"unknown environment {env!r}; expected one of {', '.join(environments)} (from cdk.json)")
    return environments[env]


def region_of(env: str, override: str | None) -> str:
    return override or _environment(env)["region"]


def declared_workloads(env: str) -> schema.WorkloadSchemas:
    """The environment's declared workloads (cdk.json), whose hyperparameters a run naming one is checked against;
    the deployed pipeline's first state checks the same (its own copy, from the last deploy)."""
    from contracts.workload import WorkloadError, parse_workloads, schemas

    try:
        return schemas(parse_workloads(_environment(env).get("workloads", {}), ROOT))
    except WorkloadError as error:
        raise CliError(f"environment {env!r} in cdk.json: {error}") from None


def environment_config(env: str):
    """The environment's configuration, from cdk.json as `cdk synth` reads it."""
    from config import ConfigError, load_config

    try:
        return load_config({**json.loads((ROOT / "cdk.json").read_text())["context"], "env": env})
    except ConfigError as error:
        raise CliError(str(error)) from None


class Pipeline:
    """The deployed pipeline of one environment: its stack outputs and clients."""

    def __init__(self, env: str, region: str, session=None) -> None:
        import boto3

        self.env, self.region = env, region
        self.session = session or boto3.Session(region_name=region)
        self.sfn = self._client("stepfunctions")
        outputs = self._outputs()
        if "StateMachineArn" not in outputs:
            raise CliError(
                f"environment {env!r}: stack {stack_name(env, 'Pipeline')} has no StateMachineArn output; "
                "redeploy the pipeline stack"
            )
        self.state_machine_arn = outputs["StateMachineArn"]
        self.max_nodes = int(outputs.get("MaxNodes", 1))
        self.min_nodes = int(outputs.get("MinNodes", 1))
        # This backend's phases (no SanityCheck where the training job checks its own hosts); older stacks: all.
        self.phases = tuple(outputs["Phases"].split(",")) if outputs.get("Phases") else STAGES
        self.log_group = outputs.get("ExecutionLogGroup")
        self.parameter = outputs.get("ApprovedModelParameter")

    def _client(self, service: str):
        return self.session.client(service, region_name=self.region, config=client_config())

    @functools.cached_property
    def _storage(self) -> dict[str, str]:
        """The storage stack's outputs ({} where it cannot be read)."""
        try:
            return self._outputs(stack_name(self.env, "Storage"))
        except CliError:
            return {}

    @property
    def bucket(self) -> str | None:
        """The data bucket: output `BucketName` of the environment's storage stack."""
        return self._storage.get("BucketName")

    @property
    def runs_table(self) -> str | None:
        """The runs table, where the pipeline claims run ids: output `RunsTableName` of the storage stack."""
        return self._storage.get(RUNS_TABLE_OUTPUT)

    def _outputs(self, stack: str | None = None) -> dict[str, str]:
        stack = stack or stack_name(self.env, "Pipeline")
        try:
            described = call(self._client("cloudformation").describe_stacks, StackName=stack)
        except CliError as error:
            if "does not exist" in str(error):
                raise CliError(
                    f"environment {self.env!r} is not deployed: no stack {stack} in {self.region} "
                    f"(deploy it with `cdk deploy -c env={self.env} {stack}`)"
                ) from None
            raise
        return {o["OutputKey"]: o["OutputValue"] for o in described["Stacks"][0].get("Outputs", [])}

    def execution_arn(self, execution: str) -> str:
        if execution.startswith("arn:"):
            return execution
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{execution}"

    def history(self, execution_arn: str, token: str | None = None) -> tuple[list[dict], str | None]:
        kwargs = {"executionArn": execution_arn, "maxResults": 1000, **({"nextToken": token} if token else {})}
        page = call(self.sfn.get_execution_history, **kwargs)
        return page["events"], page.get("nextToken")

    def all_history(self, execution_arn: str) -> list[dict]:
        events, token = self.history(execution_arn)
        while token:
            more, token = self.history(execution_arn, token)
            events += more
        return events


def call(method, **kwargs):
    """Call boto3, turning credential and API errors into one-line CliErrors."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        ReadTimeoutError,
    )

    try:
        return method(**kwargs)
    except NoCredentialsError:
        raise CliError("no AWS credentials found: set AWS_PROFILE, run `aws configure` or `aws sso login`") from None
    except NoRegionError:
        raise CliError("no AWS region: pass --region or set AWS_REGION") from None
    except ClientError as error:
        code, message = error.response["Error"].get("Code", ""), error.response["Error"].get("Message", "")
        if code in ("ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException", "InvalidClientTokenId"):
            raise CliError(f"AWS credentials were refused ({code}): refresh them (`aws sso login`)") from None
        if code == "ExecutionDoesNotExist":
            raise CliError(f"no such execution: {kwargs.get('executionArn')}") from None
        raise CliError(_one_line(f"{code}: {message}")) from None
    except (ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError) as error:
        raise CliError(f"AWS did not answer after {ATTEMPTS} attempts: {_one_line(error)}") from None
    except BotoCoreError as error:
        raise CliError(_one_line(error)) from None


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _json_object(text: object) -> dict:
    """A JSON object from text, or {} for anything else (an array, null, a string, text that is not JSON)."""
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}

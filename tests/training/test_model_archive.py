"""A declared workload's validation on SageMaker reads the model its training wrote: the training job's model.tar.gz
arrives in the `model` channel as it is, and the launcher unpacks it into MODEL_DIR before the validate command runs
(runtime/launch/sagemaker.py unpack_model_archive, runtime/user_validate.py).

SageMaker: "/opt/ml/model – ... SageMaker AI copies this data as a single object in compressed tar format to the S3
location that you specified" ("How Amazon SageMaker AI Processes Training Output"); a channel is not unpacked
(API_Channel: "CompressionType is used only in Pipe input mode. In File mode, leave this field unset or set it to
None")."""

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from contracts.workload import parse_workload
from efa_training.runtime import user_validate
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch.sagemaker import unpack_model_archive

# The validate command reads the model the train script left in MODEL_DIR and writes its metric beside it.
EVALUATE = (
    "import json, os, pathlib; d = pathlib.Path(os.environ['MODEL_DIR']); "
    "w = json.loads((d / 'weights.json').read_text()); "
    "(d / 'metrics.json').write_text(json.dumps({'eval_loss': w['loss']}))"
)


def _declaration() -> str:
    declared = {
        "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v1"},
        "train": ["python", "train.py"],
        "validate": [sys.executable, "-c", EVALUATE],
        "metric": {"name": "eval_loss", "direction": "lower"},
    }
    return json.dumps(parse_workload("my-llm", declared, Path(".")).as_json())


def _model_tar(channel: Path, files: dict[str, str]) -> Path:
    """A model.tar.gz as SageMaker makes one of training's /opt/ml/model: its files at the archive's top."""
    channel.mkdir(parents=True, exist_ok=True)
    archive = channel / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return archive


def _validate(tmp_path: Path, monkeypatch, channel: Path, capsys) -> tuple[int, dict]:
    monkeypatch.setenv("WORKLOAD", _declaration())
    model_dir = tmp_path / "opt-ml-model"  # SageMaker's /opt/ml/model: empty when the validation job starts
    args = ["--run-id", "run-7", "--run-dir", str(tmp_path / "run"), "--model-dir", str(model_dir)]
    code = user_validate.main([*args, "--model-archive", str(channel), "--baseline", "3.0"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return code, (lines[-1]["verdict"] if lines else {})


def test_the_validate_command_reads_the_model_training_wrote(tmp_path, monkeypatch, capsys):
    channel = tmp_path / "input/data/model"
    # Training's own metrics.json travels in the archive too: the gate must judge the validation's, not it.
    _model_tar(channel, {"weights.json": json.dumps({"loss": 2.5}), "metrics.json": json.dumps({"eval_loss": 9.0})})
    code, verdict = _validate(tmp_path, monkeypatch, channel, capsys)
    assert code == 0
    assert verdict["value"] == 2.5 and verdict["passed"] is True


def test_an_archive_naming_a_path_outside_the_model_folder_is_refused_in_one_line(tmp_path):
    channel = tmp_path / "model"
    _model_tar(channel, {"../escaped.txt": "x"})
    with pytest.raises(UsageError, match="--model-archive") as refused:
        unpack_model_archive(channel, tmp_path / "model-dir")
    assert "\n" not in str(refused.value) and not (tmp_path / "escaped.txt").exists()


def test_a_model_channel_without_the_archive_is_refused_naming_what_it_holds(tmp_path):
    channel = tmp_path / "model"
    channel.mkdir()
    with pytest.raises(UsageError, match="none found"):
        unpack_model_archive(channel, tmp_path / "model-dir")

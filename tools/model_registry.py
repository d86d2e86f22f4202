"""`describe`'s registry line: where the run's approved model is in the SageMaker Model Registry, or why it is not.

Read from the execution's history: the `$.registry` the pipeline set after the approval
(constructs/pipeline/model_registry.py), {group, model_package, status} or {group, error, cause}.
"""

import json

REGISTRY_STATES = ("ModelRegistered", "ApprovedButNotRegistered")


def lines(events: list[dict]) -> list[str]:
    for event in events:
        details = event.get("stateExitedEventDetails", {})
        if details.get("name") not in REGISTRY_STATES:
            continue
        try:
            registry = json.loads(details.get("output") or "{}").get("registry", {})
        except json.JSONDecodeError:
            return []
        if registry.get("model_package"):
            version = registry["model_package"].rsplit("/", 1)[-1]
            return [f"registry   {registry.get('group')} version {version} ({registry.get('status')}): "
                    f"{registry['model_package']}"]  # fmt: skip
        cause = str(registry.get("cause", "")).splitlines()[0] if registry.get("cause") else ""
        return [f"registry   not registered in {registry.get('group')}: {registry.get('error')} {cause}".rstrip()]
    return []

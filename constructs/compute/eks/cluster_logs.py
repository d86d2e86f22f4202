"""The log groups EKS and the observability add-on would otherwise create at run time, without retention.

Created by the stack first, with the environment's retention, under the names the services write to (a service that
finds its group already there writes into it):
- control plane: /aws/eks/<cluster>/cluster (EKS user guide, "Send control plane logs to CloudWatch Logs",
  control-plane-logs.html), created by EKS when the cluster is created, so the cluster must wait for it;
- Container Insights: /aws/containerinsights/<cluster>/{application,dataplane,host} (Fluent Bit: CloudWatch user
  guide, "Set up Fluent Bit as a DaemonSet to send logs to CloudWatch Logs", Container-Insights-setup-logs-
  FluentBit.html, "creates the following log groups if they don't already exist") and /performance (the agent's
  performance log events: "Container Insights performance log events for Amazon EKS and Kubernetes",
  Container-Insights-reference-performance-logs-EKS.html), created once the add-on's agents run.
"""

import aws_cdk as cdk
import aws_cdk.aws_logs as logs

from constructs import Construct
from constructs.nag import acknowledge_log_group_encryption

CONTAINER_INSIGHTS = ("application", "dataplane", "host", "performance")


def control_plane_log_group(cluster_name: str) -> str:
    return f"/aws/eks/{cluster_name}/cluster"


def container_insights_log_group(cluster_name: str, kind: str) -> str:
    return f"/aws/containerinsights/{cluster_name}/{kind}"


class ClusterLogGroups(Construct):
    """`control_plane`: the group the cluster must be created after; `container_insights`: kind -> group, which the
    observability add-on must be created after."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster_name: str,
        retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id_)

        def group(construct_id: str, name: str) -> logs.LogGroup:
            log_group = logs.LogGroup(
                self, construct_id, log_group_name=name, retention=retention, removal_policy=removal_policy
            )
            acknowledge_log_group_encryption(log_group)
            return log_group

        self.control_plane = group("ControlPlane", control_plane_log_group(cluster_name))
        self.container_insights = {
            kind: group(f"ContainerInsights{kind.capitalize()}", container_insights_log_group(cluster_name, kind))
            for kind in CONTAINER_INSIGHTS
        }

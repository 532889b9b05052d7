"""Pulumi program: read the stack's configuration, declare the deployment, export its names.

Configuration keys are the camelCase names of ``stack.DeployConfig``'s fields
(``pulumi config set project my-proj``, ``pulumi config set maxInstances 20``, ...);
``infra/deploy/deploy.sh`` sets them from its environment variables.
"""

import pulumi
import stack


def main() -> None:
    """Build the stack from ``pulumi config`` and export what an operator needs."""
    config = stack.from_getter(pulumi.Config().get)
    resources = stack.build(config)
    for name, value in stack.exports(config, resources).items():
        pulumi.export(name, value)


main()

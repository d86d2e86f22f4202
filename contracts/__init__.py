"""Plain-Python contracts shared by the CDK app, the operator CLI and the tests (no CDK, no Node.js).

Outside the `constructs` namespace on purpose: importing anything under `constructs/` loads the
`constructs` library and starts jsii's Node.js process, which a CLI or a test of pure rules must not pay for.
"""

"""As deployed: the ONNX model run the way users run it (onnxruntime's optimizations, config entries,
providers), compared with torch and with the model as written, and the optimizer, config entry or
provider named when the deployed run is worse (``check.py``)."""

from sbs_widget.deployed.check import check_deployed
from sbs_widget.deployed.result import Cause, DeployedResult, FusedNode, Location, OutputError, Step
from sbs_widget.deployed.runtime import DeployedRuntime

__all__ = ["Cause", "DeployedResult", "DeployedRuntime", "FusedNode", "Location", "OutputError", "Step",
           "check_deployed"]

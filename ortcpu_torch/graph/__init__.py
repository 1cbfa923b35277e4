"""The graph front end: ONNX graphs run on our kernels (see DESIGN.md, "The graph front
end"). ``build_gradient_graph`` turns an ONNX forward model into a training graph."""

from .gradient import FORWARD_NODES_KEY, GradientBuildError, build_gradient_graph

__all__ = ["FORWARD_NODES_KEY", "GradientBuildError", "build_gradient_graph"]

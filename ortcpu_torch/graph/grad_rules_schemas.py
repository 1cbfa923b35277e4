"""ONNX schemas for the ONNX Runtime ops that training graphs use in the *ONNX* domain
(ORT registers MaxPoolGrad and AveragePoolGrad there at opset 9, and its contrib
SimplifiedLayerNormalization at opset 1), so that ``onnx.checker`` accepts such graphs.

``register_ort_onnx_domain_schemas()`` adds them to onnx's schema registry (once per
process; onnx has no per-call registry). com.microsoft ops need nothing: the checker
does not validate nodes of domains it does not know.
"""

from __future__ import annotations

from onnx import defs

_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape",
               "pads", "storage_order", "strides")


def _schemas() -> list[defs.OpSchema]:
    S = defs.OpSchema
    P = S.FormalParameter
    opt = S.FormalParameterOption.Optional
    A = S.AttrType

    def pool_attrs():
        types = {"auto_pad": A.STRING}
        return [S.Attribute(n, types.get(n, A.INTS if n in ("dilations", "kernel_shape",
                                                             "pads", "strides") else A.INT),
                            "", required=False) for n in _POOL_ATTRS]

    return [
        S("MaxPoolGrad", "", 9, inputs=[P("dY", "T"), P("Indices", "I")],
          outputs=[P("dX", "T")],
          type_constraints=[("T", _FLOATS, ""), ("I", ["tensor(int64)"], "")],
          attributes=pool_attrs()),
        S("AveragePoolGrad", "", 9, inputs=[P("dY", "T")], outputs=[P("dX", "T")],
          type_constraints=[("T", _FLOATS, "")], attributes=pool_attrs()),
        S("SimplifiedLayerNormalization", "", 1,
          inputs=[P("X", "T"), P("scale", "V")],
          outputs=[P("Y", "V"), P("inv_std_var", "U", param_option=opt)],
          type_constraints=[("T", _FLOATS, ""), ("U", _FLOATS, ""), ("V", _FLOATS, "")],
          attributes=[S.Attribute("axis", A.INT, "", required=False),
                      S.Attribute("epsilon", A.FLOAT, "", required=False),
                      S.Attribute("stash_type", A.INT, "", required=False)]),
    ]


def register_ort_onnx_domain_schemas() -> None:
    """Make onnx know ORT's ONNX-domain training ops (idempotent)."""
    for schema in _schemas():
        if not defs.has(schema.name, schema.domain):
            defs.register_schema(schema)

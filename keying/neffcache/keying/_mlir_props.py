"""Operation properties in MLIR bytecode (version 5 on), decoded by each operation's
fields.

ODS writes the properties of an operation (mlir-tblgen OpDefinitionsGen.cpp,
genPropertiesSupportForBytecode) as its attributes sorted by name: a required one as
an attribute number, an optional or default-valued one as 0 when absent, else
``number << 1 | 1``. The blob itself says neither which fields are optional nor where
one ends and the next begins, so it can only be read with the operation's field list,
and properties hold attribute numbers, which move when locations come and go (see
``_mlir``). ``LAYOUTS`` lists the fields: name, ``?`` if optional, and the attribute
kinds its constraint allows (``b`` builtin, ``s`` stablehlo, ``c`` chlo code; ``*``
any). It was generated from the ODS-generated Python bindings of jaxlib 0.10.2
(builtin, func, stablehlo, chlo); tests/keying/test_mlir.py checks it against the
installed bindings. Operations with non-attribute properties (operand segment sizes:
chlo.scan) are left out.

A blob is read only if it fits its operation's layout exactly: every field there, no
byte left over, each optional field 0 or odd, each attribute in range, not a location
and of an allowed kind. A blob that does not fit, or of an operation the table lacks,
is opaque: ``_mlir`` then hashes it raw and pins every table by position.

What the table cannot prove is that the writer used the same fields: a bytecode file
means nothing without its dialects (MLIR's bytecode promises hold "assuming immutable
dialects"), and a reader with other definitions misreads it, the compiler included.
The checks above make a misread blob fail to fit in all but contrived cases: a changed
layout would have to keep the number of fields, give each optional field only 0 or odd
values, and land every attribute number on an attribute of the expected kind.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._mlir_attrs import Entries, Kind
from ._mlir_reader import long_varint

Field = tuple[str, bool, frozenset[Kind] | None]  # name, optional, allowed kinds

_DIALECT_LETTERS = {"b": b"builtin", "s": b"stablehlo", "c": b"chlo"}

# Generated from the ODS Python bindings of jaxlib 0.10.2; keep sorted.
_SPECS = {
    "builtin.module": "sym_name?=b2|b3 sym_visibility?=b2|b3",
    "chlo.broadcast_add": "broadcast_dimensions?=b17",
    "chlo.broadcast_and": "broadcast_dimensions?=b17",
    "chlo.broadcast_atan2": "broadcast_dimensions?=b17",
    "chlo.broadcast_compare": "broadcast_dimensions?=b17 compare_type?=c1 comparison_direction=c0",
    "chlo.broadcast_complex": "broadcast_dimensions?=b17",
    "chlo.broadcast_divide": "broadcast_dimensions?=b17",
    "chlo.broadcast_maximum": "broadcast_dimensions?=b17",
    "chlo.broadcast_minimum": "broadcast_dimensions?=b17",
    "chlo.broadcast_multiply": "broadcast_dimensions?=b17",
    "chlo.broadcast_next_after": "broadcast_dimensions?=b17",
    "chlo.broadcast_or": "broadcast_dimensions?=b17",
    "chlo.broadcast_polygamma": "broadcast_dimensions?=b17",
    "chlo.broadcast_power": "broadcast_dimensions?=b17",
    "chlo.broadcast_remainder": "broadcast_dimensions?=b17",
    "chlo.broadcast_shift_left": "broadcast_dimensions?=b17",
    "chlo.broadcast_shift_right_arithmetic": "broadcast_dimensions?=b17",
    "chlo.broadcast_shift_right_logical": "broadcast_dimensions?=b17",
    "chlo.broadcast_subtract": "broadcast_dimensions?=b17",
    "chlo.broadcast_xor": "broadcast_dimensions?=b17",
    "chlo.broadcast_zeta": "broadcast_dimensions?=b17",
    "chlo.constant": "value=b16|b18|b19|b20",
    "chlo.constant_like": "value=*",
    "chlo.ragged_dot": "precision_config?=b0 ragged_dot_dimension_numbers=*",
    "chlo.top_k": "k=b8",
    "func.call": "arg_attrs?=b0 callee=b4 no_inline?=b7 res_attrs?=b0",
    "func.call_indirect": "arg_attrs?=b0 res_attrs?=b0",
    "func.constant": "value=b4",
    "func.func": (
        "arg_attrs?=b0 function_type=b6 no_inline?=b7 res_attrs?=b0 sym_name=b2|b3 "
        "sym_visibility?=b2|b3"
    ),
    "stablehlo.all_gather": (
        "all_gather_dim=b8 channel_handle?=s1 replica_groups=b16|b18|b19|b20|s18 "
        "use_global_device_ids?=b7"
    ),
    "stablehlo.all_reduce": (
        "channel_handle?=s1 replica_groups=b16|b18|b19|b20|s18 use_global_device_ids?=b7"
    ),
    "stablehlo.all_to_all": (
        "channel_handle?=s1 concat_dimension=b8 replica_groups=b16|b18|b19|b20|s18 split_count=b8 "
        "split_dimension=b8"
    ),
    "stablehlo.batch_norm_grad": "epsilon=b9 feature_index=b8",
    "stablehlo.batch_norm_inference": "epsilon=b9 feature_index=b8",
    "stablehlo.batch_norm_training": "epsilon=b9 feature_index=b8",
    "stablehlo.broadcast": "broadcast_sizes=b17",
    "stablehlo.broadcast_in_dim": "broadcast_dimensions=b17",
    "stablehlo.cbrt": "result_accuracy?=s17",
    "stablehlo.cholesky": "lower?=b8",
    "stablehlo.collective_broadcast": "channel_handle?=s1 replica_groups=b16|b18|b19|b20|s18",
    "stablehlo.collective_permute": "channel_handle?=s1 source_target_pairs=b16|b18|b19|b20",
    "stablehlo.compare": "compare_type?=s3 comparison_direction=s2",
    "stablehlo.composite": "composite_attributes?=b1 decomposition=b4 name=b2|b3 version?=b8",
    "stablehlo.concatenate": "dimension=b8",
    "stablehlo.constant": "value=b16|b18|b19|b20",
    "stablehlo.convolution": (
        "batch_group_count=b8 dimension_numbers=s4 feature_group_count=b8 lhs_dilation?=b17 "
        "padding?=b16|b18|b19|b20 precision_config?=b0 rhs_dilation?=b17 window_reversal?=b17 "
        "window_strides?=b17"
    ),
    "stablehlo.cosine": "result_accuracy?=s17",
    "stablehlo.cross-replica-sum": "replica_groups=b16|b18|b19|b20",
    "stablehlo.custom_call": (
        "api_version?=b8 backend_config?=b1|b2|b3 call_target_name=b2|b3 called_computations?=b0 "
        "has_side_effect?=b8 operand_layouts?=b0 output_operand_aliases?=b0 result_layouts?=b0"
    ),
    "stablehlo.dot": "precision_config?=b0",
    "stablehlo.dot_general": "algorithm?=s15 dot_dimension_numbers=s5 precision_config?=b0",
    "stablehlo.dynamic_broadcast_in_dim": (
        "broadcast_dimensions=b17 known_expanding_dimensions?=b17 "
        "known_nonexpanding_dimensions?=b17"
    ),
    "stablehlo.dynamic_conv": (
        "batch_group_count=b8 dimension_numbers=s4 feature_group_count=b8 lhs_dilation?=b17 "
        "precision_config?=b0 rhs_dilation?=b17 window_reversal?=b17 window_strides?=b17"
    ),
    "stablehlo.dynamic_gather": "dimension_numbers=s7 indices_are_sorted?=b8",
    "stablehlo.dynamic_iota": "iota_dimension=b8",
    "stablehlo.dynamic_slice": "slice_sizes=b17",
    "stablehlo.einsum": "einsum_config=b2|b3",
    "stablehlo.exponential": "result_accuracy?=s17",
    "stablehlo.exponential_minus_one": "result_accuracy?=s17",
    "stablehlo.fft": "fft_length=b17 fft_type=s6",
    "stablehlo.gather": "dimension_numbers=s7 indices_are_sorted?=b8 slice_sizes=b17",
    "stablehlo.get_dimension_size": "dimension=b8",
    "stablehlo.get_tuple_element": "index=b8",
    "stablehlo.infeed": "infeed_config?=b2|b3 layout?=b0",
    "stablehlo.iota": "iota_dimension=b8",
    "stablehlo.log": "result_accuracy?=s17",
    "stablehlo.log_plus_one": "result_accuracy?=s17",
    "stablehlo.logistic": "result_accuracy?=s17",
    "stablehlo.map": "dimensions=b17",
    "stablehlo.outfeed": "outfeed_config?=b2|b3",
    "stablehlo.pad": "edge_padding_high=b17 edge_padding_low=b17 interior_padding=b17",
    "stablehlo.recv": "channel_handle=s1 is_host_transfer?=b8 source_target_pairs?=b16|b18|b19|b20",
    "stablehlo.reduce": "dimensions=b17",
    "stablehlo.reduce_precision": "exponent_bits=b8 mantissa_bits=b8",
    "stablehlo.reduce_scatter": (
        "channel_handle?=s1 replica_groups=b16|b18|b19|b20|s18 scatter_dimension=b8 "
        "use_global_device_ids?=b7"
    ),
    "stablehlo.reduce_window": (
        "base_dilations?=b17 padding?=b16|b18|b19|b20 window_dilations?=b17 window_dimensions=b17 "
        "window_strides?=b17"
    ),
    "stablehlo.reverse": "dimensions=b17",
    "stablehlo.rng": "rng_distribution=s10",
    "stablehlo.rng_bit_generator": "rng_algorithm=s9",
    "stablehlo.rsqrt": "result_accuracy?=s17",
    "stablehlo.scatter": "indices_are_sorted?=b8 scatter_dimension_numbers=s11 unique_indices?=b8",
    "stablehlo.select_and_scatter": (
        "padding?=b16|b18|b19|b20 window_dimensions?=b17 window_strides?=b17"
    ),
    "stablehlo.send": "channel_handle=s1 is_host_transfer?=b8 source_target_pairs?=b16|b18|b19|b20",
    "stablehlo.set_dimension_size": "dimension=b8",
    "stablehlo.sine": "result_accuracy?=s17",
    "stablehlo.slice": "limit_indices=b17 start_indices=b17 strides=b17",
    "stablehlo.sort": "dimension?=b8 is_stable?=b8",
    "stablehlo.sqrt": "result_accuracy?=s17",
    "stablehlo.tan": "result_accuracy?=s17",
    "stablehlo.tanh": "result_accuracy?=s17",
    "stablehlo.torch_index_select": "batch_dims=b8 dim=b8",
    "stablehlo.transpose": "permutation=b17",
    "stablehlo.triangular_solve": "left_side=b8 lower=b8 transpose_a=s12 unit_diagonal=b8",
    "stablehlo.unary_einsum": "einsum_config=b2|b3",
}


def _field(spec: str) -> Field:
    name, _, kinds = spec.partition("=")
    allowed = None
    if kinds != "*":
        allowed = frozenset((_DIALECT_LETTERS[kind[0]], int(kind[1:])) for kind in kinds.split("|"))
    return name.rstrip("?"), name.endswith("?"), allowed


LAYOUTS: Mapping[bytes, tuple[Field, ...]] = {
    op.encode(): tuple(map(_field, spec.split())) for op, spec in _SPECS.items()
}
_ABSENT, _PRESENT, _DROPPED = b"\x00", b"\x01", b"\x02"


def decode_properties(
    blob: bytes, layout: tuple[Field, ...], entries: Entries, drop: str = ""
) -> bytes | None:
    """The canonical content of ``blob``: per field absent, or the attribute's digest;
    the field named ``drop`` as a marker whether present or not. None if the blob
    does not fit ``layout``."""
    out = []
    pos = 0
    for name, optional, allowed in layout:
        if pos >= len(blob):
            return None
        first = blob[pos]
        if first & 1:
            value, pos = first >> 1, pos + 1
        else:
            try:
                value, pos = long_varint(blob, pos)
            except IndexError:
                return None
        if optional:
            if value == 0:
                out.append(_DROPPED if name == drop else _ABSENT)
                continue
            if not value & 1:
                return None
            value >>= 1
        if not _fits(value, allowed, entries):
            return None
        out.append(_DROPPED if name == drop else _PRESENT + entries.digest(value))
    if pos != len(blob):
        return None
    return b"".join(out)


def _fits(node: int, allowed: frozenset[Kind] | None, entries: Entries) -> bool:
    if node >= entries.n_attrs or entries.is_location[node]:
        return False
    return allowed is None or entries.kind(node) in allowed

"""``unload_of`` (the shedders' fast path) builds the decision ``make_decision`` builds for an
unload: same fields, same id, same bytes on the wire, for any names, reasons and inputs."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from loadbalance.decisions import UNLOAD, encode_decision, make_decision, unload_of
from loadbalance.values import DecisionReason

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    _text,
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=200, deadline=None)
@given(
    lower=st.integers(0, 0xFFFFFFFE),
    width=st.integers(1, 0xFFFFFFFF),
    namespace=st.sampled_from(["t/ns", "pulsar/system", "a-b/c_d.e=f:g"]),
    upper_case=st.booleans(),
    cycle=_text,
    source=_text,
    reason=st.one_of(_text, st.sampled_from(list(DecisionReason))),
    inputs=st.dictionaries(_text, _scalar, max_size=5),
    at=st.integers(0, 2**62),
)
def test_unload_of_is_the_unload_make_decision_gives(
    lower, width, namespace, upper_case, cycle, source, reason, inputs, at
):
    bundle = f"{namespace}/0x{lower:08x}_0x{min(lower + width, 0xFFFFFFFF):08x}"
    if upper_case:  # a spelling make_decision canonicalises
        bundle = bundle.replace("0x", "0X").upper().replace("0X", "0x")
        bundle = f"{namespace}/{bundle.rsplit('/', 1)[1]}"
    want = make_decision(cycle=cycle, kind=UNLOAD, bundle=bundle, source_broker=source,
                         reason=reason, strategy="ThresholdShedder", inputs=inputs,
                         decided_at_ms=at)  # fmt: skip
    got = unload_of(cycle=cycle, bundle=bundle, source_broker=source, reason=reason,
                    strategy="ThresholdShedder", inputs=dict(inputs), decided_at_ms=at)  # fmt: skip
    assert got == want and repr(got) == repr(want)
    assert got.bundle == want.bundle and got.id == want.id
    assert isinstance(got.inputs, MappingProxyType)
    assert encode_decision(got) == encode_decision(want)

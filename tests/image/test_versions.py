import pytest

from gpucloud.image.versions import Version, VersionError


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("580.95.05", "580.105.08"),  # numeric, not lexical: 95 < 105
        ("2.18.5", "2.28.3-1"),  # NCCL package release suffix ignored for ordering
        ("1.7.3", "1.7.4-aws"),
        ("12.9", "13.0.2"),
        ("v1.29", "1.45.0"),
    ],
)
def test_ordering(lower, higher):
    assert Version.parse(lower) < Version.parse(higher)
    assert not Version.parse(higher) < Version.parse(lower)


def test_equal_with_missing_trailing_zeros_and_suffix():
    assert Version.parse("13.0") == Version.parse("13.0.0")
    assert Version.parse("2.28.3-1+cuda13.0") == Version.parse("2.28.3-1")


def test_str_keeps_leading_zeros_as_written():
    assert str(Version.parse("580.105.08")) == "580.105.08"
    assert Version.parse("580.105.08").release == (580, 105, 8)


def test_series_membership():
    assert Version.parse("2.15.4").startswith(Version.parse("2.15"))
    assert not Version.parse("2.12.9").startswith(Version.parse("2.15"))


@pytest.mark.parametrize("text", ["", "latest", "1..2", "12.x", "1.2.3.4.5", "-1"])
def test_rejects_non_versions_with_the_accepted_form(text):
    with pytest.raises(VersionError, match="expected dotted numbers"):
        Version.parse(text)

"""The ACL file (RocketMQ's plain_acl.yml keys, in TOML) and its replicated canonical document."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.acl.config import DOCUMENT_BYTES_MAX, AclConfig, load_acl_file
from broker.acl.permissions import DENY, PUB, SUB, AclConfigError
from tests.acl.helpers import BASE_ACL

EXAMPLE = """
globalWhiteRemoteAddresses = ["10.10.103.*", "192.168.0.*"]

[[accounts]]
accessKey = "RocketMQ"
secretKey = "12345678"
whiteRemoteAddress = ""
admin = false
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"]
groupPerms = ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]

[[accounts]]
accessKey = "rocketmq2"
secretKey = "12345678"
whiteRemoteAddress = "192.168.1.*"
admin = true
"""


def test_rocketmq_example_reads_as_rocketmq_means_it() -> None:
    config = AclConfig.from_toml(EXAMPLE)
    assert config.global_white_remote_addresses == ("10.10.103.*", "192.168.0.*")
    first, second = config.accounts
    assert (first.access_key, first.secret_key, first.admin) == ("RocketMQ", "12345678", False)
    assert (first.default_topic_perm, first.default_group_perm) == (DENY, SUB)
    assert dict(first.topic_perms) == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB}
    assert dict(first.group_perms) == {"groupA": DENY, "groupB": PUB | SUB, "groupC": SUB}
    # missing defaults are DENY, as PlainAccessResource's defaults
    assert (second.default_topic_perm, second.default_group_perm, second.admin) == (DENY, DENY, True)
    assert config.account("rocketmq2") is second and config.account("nobody1") is None


def test_document_round_trips_and_is_canonical() -> None:
    config = AclConfig.from_toml(EXAMPLE)
    document = config.to_document()
    assert AclConfig.from_document(document) == config
    # the same rules written differently: other order, other spacing, SUB|PUB for PUB|SUB
    reordered = AclConfig.from_toml(EXAMPLE.replace('"topicB=PUB|SUB", ', "").replace(
        'topicPerms = ["topicA=DENY", ', 'topicPerms = ["topicB = SUB|PUB", "topicA=DENY", '))
    assert reordered.to_document() == document


def test_base_acl_of_the_tests_is_valid() -> None:
    assert len(AclConfig.from_toml(BASE_ACL).accounts) == 3


@pytest.mark.parametrize(("text", "complaint"), [
    ("nonsense = 1\nglobalWhiteRemoteAddresses = ['*']", "unknown key"),
    ("", "no accounts and no globalWhiteRemoteAddresses"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\ncolour = 'red'", "unknown key"),
    ("[[accounts]]\naccessKey = 'short'\nsecretKey = 'abcdefg'", "accessKey must be"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = '123456'", "secretKey must be"),
    ("[[accounts]]\nsecretKey = 'abcdefg'", "accessKey must be a string"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\ndefaultTopicPerm = 'PUBSUB'", "permission"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\ntopicPerms = ['a=PUB=SUB']", "topicPerms"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\ntopicPerms = ['a=PUB', 'a=SUB']", "twice"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\ngroupPerms = ['=PUB']", "no name"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\nadmin = 'yes'", "admin"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\nwhiteRemoteAddress = '10.1.2'", "whitelist"),
    ("[[accounts]]\naccessKey = 'abcdefg'\nsecretKey = 'abcdefg'\n[[accounts]]\naccessKey = 'abcdefg'\n"
     "secretKey = 'hijklmn'", "appears twice"),
    ("globalWhiteRemoteAddresses = ['300.1.1.1']", "whitelist"),
    ("globalWhiteRemoteAddresses = 5", "globalWhiteRemoteAddresses"),
    ("accounts = 5", "accounts"),
    ("accounts = [5]", "must be a table"),
    ("[accounts", "not valid TOML"),
])
def test_bad_files_are_rejected_naming_the_problem(text: str, complaint: str) -> None:
    with pytest.raises(AclConfigError, match=complaint):
        AclConfig.from_toml(text)


@pytest.mark.parametrize("document", [b"", b"\xff", b"[]", b'{"accounts": []}', b'{"format": "other"}',
                                      b"{" * 100_000])
def test_bad_documents_are_rejected(document: bytes) -> None:
    with pytest.raises(AclConfigError):
        AclConfig.from_document(document)


def test_document_size_is_bounded() -> None:
    accounts = "".join(f'[[accounts]]\naccessKey = "key-{index:06}"\nsecretKey = "{"s" * 1000}"\n'
                       for index in range(1100))
    with pytest.raises(AclConfigError, match="at most"):
        AclConfig.from_toml(accounts).to_document()
    with pytest.raises(AclConfigError, match="too large"):
        AclConfig.from_document(b" " * (DOCUMENT_BYTES_MAX + 1))


def test_load_acl_file(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(EXAMPLE)
    assert load_acl_file(path) == AclConfig.from_toml(EXAMPLE)
    with pytest.raises(AclConfigError, match="cannot read"):
        load_acl_file(tmp_path / "missing.toml")

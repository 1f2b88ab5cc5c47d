"""The error tree survives pickling with its message, type and fields."""

import pickle

import pytest

from eos_core.errors import (
    CommitUnknown,
    ConfigError,
    DataLossError,
    EosError,
    FatalError,
    RetriableError,
    ServiceError,
)


@pytest.mark.parametrize(
    "cls", [EosError, ConfigError, RetriableError, FatalError, CommitUnknown, ServiceError, DataLossError]
)
def test_round_trips_through_pickle(cls):
    err = cls("it broke: option 'x'", option="x", sqlstate="40001")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == "it broke: option 'x'"
    assert back.option == "x"
    assert back.sqlstate == "40001"
    assert back.fields == {"option": "x", "sqlstate": "40001"}


def test_hierarchy_sorts_failures():
    assert issubclass(CommitUnknown, FatalError)
    assert issubclass(DataLossError, FatalError)
    assert issubclass(ConfigError, ValueError)  # callers catching ValueError still see config errors
    assert not issubclass(RetriableError, FatalError)

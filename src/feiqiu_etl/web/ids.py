"""The ``{run_id:run_id}`` path parameter of the web routes: a route matches only a text that may be a run id
(:data:`feiqiu_etl.registry.RUN_ID_CHARACTERS`), so ``/api/runs/%00`` or a 10,000-character id is a 404
like any unknown path, and never reaches the database (issue 21, finding 9)."""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor

from feiqiu_etl.registry import RUN_ID_CHARACTERS


class RunIdConvertor(Convertor):
    regex = RUN_ID_CHARACTERS

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("run_id", RunIdConvertor())

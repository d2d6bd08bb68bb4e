"""Singer's deletes in a table (SPEC.md §12): ``_sdc_deleted_at`` and ACTIVATE_VERSION.

A current record with ``_sdc_deleted_at``, and rows of older table versions placed before an
ACTIVATE_VERSION, stay with ``_sdc_deleted_at`` set (soft, the default) or are left out
(``hard_delete``); activations the table has not applied yet reach every previous part.
"""

from __future__ import annotations

from singerlake.format.exact import decode, join, join_all

SDC_DELETED_AT = "_sdc_deleted_at"


DELETED_AT = {"type": ["string", "null"], "format": "date-time"}  # the column soft deletes add when the schema has none


DELETED_AT_IF_USED = {**DELETED_AT, "singerlake.added": "when used"}  # ... shown only once a row has a deletion time


# -- deletes: _sdc_deleted_at and ACTIVATE_VERSION (SPEC.md §12) ---------------------------------------
def deletes_properties(properties: dict, hard: bool, activated: bool) -> dict:
    """The properties whose values parts record: the declared ones, plus (soft deletes) ``_sdc_deleted_at``
    when the schema does not declare it: always shown once the stream has an activation, else once used."""
    if hard or SDC_DELETED_AT in properties:
        return properties
    return {**properties, SDC_DELETED_AT: DELETED_AT if activated else DELETED_AT_IF_USED}


def table_properties(properties: dict, types: dict) -> dict:
    """The published columns: an added ``_sdc_deleted_at`` no row uses yet is left out."""
    if properties.get(SDC_DELETED_AT) == DELETED_AT_IF_USED and types.get(SDC_DELETED_AT) is None:
        return {name: spec for name, spec in properties.items() if name != SDC_DELETED_AT}
    return properties


def run_types(parts: list[dict], properties: dict, previous: dict) -> dict:
    """The table's column types: the join of its parts' needs. An added ``_sdc_deleted_at`` the table
    showed stays (its previous need joined in), so the column does not come and go with its rows."""
    types = join_all([part["needs"] for part in parts])
    if properties.get(SDC_DELETED_AT) == DELETED_AT_IF_USED and previous.get(SDC_DELETED_AT) is not None:
        types[SDC_DELETED_AT] = join(types.get(SDC_DELETED_AT), previous[SDC_DELETED_AT])
    return types


def record_deleted(text: str) -> bool:
    if f'"{SDC_DELETED_AT}"' not in text:  # most records: no need to decode them
        return False
    record = decode(text)
    return isinstance(record, dict) and record.get(SDC_DELETED_AT) is not None


def apply_deletes(table, activations: list[dict], hard: bool):
    """Current rows (conformed staging rows) with deletes applied: each activation deletes the rows placed
    before it whose table version is older or none (the first one names their ``_singerlake_deleted_at``);
    ``hard`` leaves out those rows and those whose record has ``_sdc_deleted_at``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not table.num_rows:
        return table
    deleted = table["_singerlake_deleted_at"]
    if activations:
        commit, index, version = table["_singerlake_commit"], table["_singerlake_index"], table["_singerlake_table_version"]
        for activation in activations:
            place = activation["after_commit"]
            before = pc.or_(pc.less(commit, place), pc.and_(pc.equal(commit, place), pc.less(index, activation["records"])))
            older = pc.or_(pc.is_null(version), pc.fill_null(pc.less(version, activation["version"]), False))
            hit = pc.and_(pc.and_(before, older), pc.is_null(deleted))
            deleted = pc.if_else(hit, pa.scalar(activation["received"], pa.string()), deleted)
        table = table.set_column(table.schema.get_field_index("_singerlake_deleted_at"), "_singerlake_deleted_at", deleted)
    if hard:
        texts = table["_record"].to_pylist()
        keep = [at is None and not record_deleted(text) for at, text in zip(deleted.to_pylist(), texts, strict=True)]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table


def deletes_changed(before, after) -> bool:
    return after.num_rows != before.num_rows or after["_singerlake_deleted_at"].null_count != before["_singerlake_deleted_at"].null_count

"""A small job's record in either form (lua/includes/lane_complete.lua), read without a
server."""

from __future__ import annotations

from streamq.producer import lane


def test_a_short_record_reads_as_the_json_one_with_its_result_apart() -> None:
    # a job that succeeded with the default settings, 12 ms after its creation
    raw = b"S1700000000123|12\nj{\"sum\": 3}"
    rec = lane.parse(raw, "images~2")
    assert rec == {"state": "succeeded", "done": 1, "failed": 0, "finished": 1700000000123,
                   "created": 1700000000111, "queue": "images~2", "priority": 50,
                   "client": "default", "max_deliveries": 5}
    assert lane.result_of(raw) == b'j{"sum": 3}'
    st = lane.status("j1", rec)
    assert (st.queue, st.state.value, st.done, st.total, st.finished_ms, st.created_ms) == (
        "images", "succeeded", 1, 1, 1700000000123, 1700000000111)


def test_a_short_record_keeps_settings_that_are_not_the_defaults_and_any_result() -> None:
    raw = b"S1700000000123|0|3|vip.client:1|2\nb\n\x00\xff"  # a newline in the result
    rec = lane.parse(raw, "q")
    assert (rec["priority"], rec["client"], rec["max_deliveries"]) == (3, "vip.client:1", 2)
    assert lane.result_of(raw) == b"b\n\x00\xff"
    assert lane.result_of(b"S1|0\n") == b""  # an empty result


def test_a_short_record_without_its_result_says_so() -> None:
    # a job whose result was too big to keep in its record (it is in `lresults`)
    raw = b"S1700000000123|12"
    assert lane.parse(raw, "q")["state"] == "succeeded"
    assert lane.result_of(raw) is None


def test_a_json_record_is_read_as_it_is_and_holds_no_result() -> None:
    raw = b'{"state":"failed","done":0,"failed":1,"finished":5,"queue":"q","priority":50}'
    assert lane.parse(raw, "q")["state"] == "failed"
    assert lane.result_of(raw) is None


def test_made_job_ids_are_short_names_that_no_command_line_reads_as_an_option() -> None:
    from streamq.base.keys import check_name
    from streamq.base.members import new_job_id, new_job_ids

    ids = [*new_job_ids(500), *(new_job_id() for _ in range(500))]
    assert len(set(ids)) == 1000
    assert all(len(i) == 22 and check_name("job id", i) and not i.startswith("-")
               for i in ids)


def test_a_handed_back_entry_is_queued_since_its_first_copy() -> None:
    from streamq.base.entry_fields import queued_s

    # an entry as first added: queued at its id's time
    assert queued_s("1795000000123-4", [b"i", b"0", b"t", b"j", b"p", b"1"]) == 1795000000.123
    # a copy handed back unstarted: queued when its first copy was (field q, last)
    copy = [b"i", b"0", b"t", b"j", b"p", b"1", b"q", b"1794999999000"]
    assert queued_s("1795000000123-4", copy) == 1794999999.0
    # a field q that is not a time, or not last, is not read as one
    assert queued_s("1795000000123-4", [b"p", b"q", b"q", b"x"]) == 1795000000.123
    assert queued_s("1795000000123-4", [b"q", b"1", b"p", b"x"]) == 1795000000.123

"""Answer bytes -> typed Arrow tables, fast, and never a silent drop: one module per kind
of answer.

* history   tag history answers (historyMany, historyFilter, history) -> TAG_HISTORY_SCHEMA,
            with per-tag stats for continuing a capped answer; fastrows reads number and
            boolean rows from the bytes, rows reads one tag's rows the exact way
* alarms    alarm history answers -> ALARM_HISTORY_SCHEMA
* details   tag details answers -> TAG_METADATA_SCHEMA, and the tag paths alone
* common    what they share: the paused collector, JSON errors, where an error points
"""

"""Answer bytes -> typed Arrow tables, fast, and never a silent drop: one module per kind
of answer.

* events    subscriptionEvents answers -> the rows history writes (TAG_HISTORY_SCHEMA), link
            status changes, model events
* history   tag history answers (historyMany, historyFilter, history) -> TAG_HISTORY_SCHEMA,
            with per-tag stats for continuing a capped answer; fastrows reads number and
            boolean rows from the bytes, rows reads one tag's rows the exact way
* alarms    alarm history answers -> ALARM_HISTORY_SCHEMA
* details   tag details answers -> TAG_METADATA_SCHEMA, and the tag paths alone
* stamps    row stamps in their unit (epoch ms, seconds, ISO 8601) as epoch ms; where the
            node stamps an aggregated bucket (learned, `BucketStamping`)
* typed     values moved to the column of their tag's configured type, the others counted
* common    what they share: the paused collector, JSON errors, where an error points
"""

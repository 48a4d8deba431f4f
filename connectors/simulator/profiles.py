"""Named readings of what the spec leaves open, so the simulator can stop agreeing with us.

A *behaviour* is one way a real node may differ from the simulator's default reading
(docs/node-behaviour.md lists the default). A *profile* is a named set of behaviours;
profiles compose with `+` (`repeated-names+node-1.21.5`), and a behaviour name may be
given where a profile name is expected. The pipeline must extract every profile's data
exactly (or refuse with one line where nothing exact is possible); the end-to-end matrix
in tests/pipelines/test_profiles.py holds it to that.
"""

from __future__ import annotations

from collections.abc import Iterable

# What each behaviour changes, in one line (shown by `historian simulate --profile list`).
BEHAVIOURS: dict[str, str] = {
    "repeated_names": "leaf names repeat across groups (/Plant A/Line 1/Temp. 000 and "
    "/Plant A/Line 2/Temp. 000)",
    "details_by_path": "tag?cmd=details and read answers keyed by full path, not by name",
    "version_1_21_5": "node 1.21.5: minPriority/maxPriority ignored (priority is the "
    "minimum); stddev and delta methods ignored (the tag's default method answers)",
    "version_1_21_12": "node 1.21.12: minPriority/maxPriority ignored (priority is the minimum)",
    "verbose_versions": "n3.versions spelled with product and runtime names "
    "(['Node.js v18.19.1', 'N3uron exe v<version> (build 2406)', 'bootstrap <version>-r2'])",
    "raw_start_exclusive": "raw start bound exclusive: a sample exactly on start is not returned",
    "raw_cap_small": "the node caps raw answers at 250 samples per tag, whatever limit says",
    "raw_uncapped": "the node has no cap of its own: only options.limit caps raw answers",
    "filter_path_only": "historyFilter reads only `path` (the URL shape of the spec)",
    "filter_paths_only": "historyFilter reads only `paths` (the parameter list of the spec)",
    "rows_2": "history rows of 2 elements [ts, value]",
    "rows_3": "history rows of 3 elements [ts, value, quality]",
    "epoch_seconds": "bare epoch start/end read as seconds; alarm history events stamped in "
    "epoch seconds",
    "flaky_tags": "a quarter of the asked tags left out of a historyMany/historyFilter answer "
    "the first time a query is asked (present when asked again)",
    "dropped_as_null": "a tag left out comes back as `data: null` instead of being absent",
    "dropped_as_name": "a tag left out comes back keyed by its leaf name, not its path",
    "loses_tags": "every seventh tag is always missing from historyMany/historyFilter answers "
    "(it is in browse and details)",
    "garbled_timestamps": "every fifth tag's history answers hold one more row stamped "
    "outside the query (negative, 1913 or 2200)",
    "link_outage": "the link to the remote site goes offline 60 s after the node starts, for "
    "240 s, then drains its store-and-forward buffer for 60 s: the remote tags' samples of "
    "the outage appear late, stamped in the past",
    "link_online_only": "link?cmd=get shows only `online` (no sf, no sides)",
    "raw_cap_per_answer": "limit and the node's own raw cap count the samples of a whole "
    "historyMany/historyFilter answer (tags in order), not of each tag",
    "browse_always_recurses": "options.recurrent ignored: browse, details, read and "
    "historyFilter always include the tags of subgroups",
    "null_without_history": "every fifth tag has no history: its history answers hold "
    "`data: null` (the spec's own example of `request.data`)",
    "clock_behind": "the node's clock runs 10 minutes behind the caller's: `sys.ts` and what "
    "it has stored stop 10 minutes short of the caller's now",
    "other_identity": "the node says it is another node: n3.node `sim-node-b` and another "
    "license uid (a flow moved to a second node)",
    "no_views": "tag?cmd=getViews answers 404 (a node without views)",
    "errors_in_200": 'errors answered with status 200 and {"error": ...} (as web '
    "frameworks do), and the first ask of every question answered so",
    "alarm_arrays": "alarm history events as arrays [ts, path, status, priority, value, "
    "description, ackInfo, origin]",
    "alarm_arrays_swapped": "alarm history events as arrays [ts, path, priority, status, "
    "value, description, ackInfo, origin]",
    "alarm_arrays_online": "alarm history events as arrays [ts, path, online, status, "
    "priority, value, description, ackInfo] (online always 1)",
    "rows_epoch_seconds": "history row timestamps in epoch seconds, with a millisecond "
    "fraction (1763640000.5), raw and aggregated",
    "rows_iso": "history row timestamps and alarm event stamps as ISO 8601 text "
    "(2026-11-20T12:00:00.500Z)",
    "rows_epoch_micros": "history row timestamps in epoch microseconds (a unit the pipeline "
    "does not read: every row lands outside the query)",
    "buckets_at_end": "aggregated rows stamped at their bucket's end: [b, b+interval) as "
    "b+interval",
    "numbers_as_strings": 'values of number tags sent as JSON strings ("12.345"), raw and '
    "aggregated",
    "events_queue_small": "a subscription's event queue holds 1,000 events (default 100,000): "
    "a slow poller loses the oldest, counted in discardedEvents",
    "events_limit_default": "subscriptionEvents without a limit answers at most 500 events, "
    "the rest in remainingEvents",
    "events_unordered": "subscriptionEvents answers events tag by tag, not in time order",
    "subscriptions_survive_restart": "subscriptions are kept across a node restart "
    "(default: a restart loses them all)",
    "discards_cumulative": "discardedEvents counts every event dropped since the subscription "
    "began, not since the last poll",
    "subscription_ids_reused": "a restart numbers new subscriptions from 1 again, so an id "
    "from before it may name another client's subscription",
}

# Named profiles: each is a set of behaviours. `default` is the simulator's own reading.
PROFILES: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "repeated-names": frozenset({"repeated_names"}),
    "details-by-path": frozenset({"repeated_names", "details_by_path"}),
    "node-1.21.5": frozenset({"version_1_21_5", "verbose_versions"}),
    "node-1.21.12": frozenset({"version_1_21_12"}),
    "raw-exclusive-start": frozenset({"raw_start_exclusive"}),
    "raw-cap": frozenset({"raw_cap_small"}),
    "raw-uncapped": frozenset({"raw_uncapped"}),
    "filter-path-only": frozenset({"filter_path_only"}),
    "filter-paths-only": frozenset({"filter_paths_only"}),
    "rows-2": frozenset({"rows_2"}),
    "rows-3": frozenset({"rows_3"}),
    "epoch-seconds": frozenset({"epoch_seconds"}),
    "flaky-tags": frozenset({"flaky_tags"}),
    "flaky-tags-null": frozenset({"flaky_tags", "dropped_as_null"}),
    "flaky-tags-renamed": frozenset({"flaky_tags", "dropped_as_name"}),
    "lost-tags": frozenset({"loses_tags"}),
    "garbled-timestamps": frozenset({"garbled_timestamps"}),
    "link-outage": frozenset({"link_outage"}),
    "link-outage-online-only": frozenset({"link_outage", "link_online_only"}),
    "raw-cap-per-answer": frozenset({"raw_cap_per_answer"}),
    "browse-always-recurses": frozenset({"browse_always_recurses"}),
    "null-without-history": frozenset({"null_without_history"}),
    "clock-behind": frozenset({"clock_behind"}),
    "other-node": frozenset({"other_identity"}),
    "no-views": frozenset({"no_views"}),
    "errors-in-200": frozenset({"errors_in_200"}),
    "alarm-arrays": frozenset({"alarm_arrays"}),
    "alarm-arrays-swapped": frozenset({"alarm_arrays_swapped"}),
    "alarm-arrays-online": frozenset({"alarm_arrays_online"}),
    "rows-epoch-seconds": frozenset({"rows_epoch_seconds"}),
    "rows-iso": frozenset({"rows_iso"}),
    "buckets-at-end": frozenset({"buckets_at_end"}),
    "numbers-as-strings": frozenset({"numbers_as_strings"}),
    "events-queue-small": frozenset({"events_queue_small"}),
    "events-limit-default": frozenset({"events_limit_default"}),
    "events-unordered": frozenset({"events_unordered"}),
    "subscriptions-survive-restart": frozenset({"subscriptions_survive_restart"}),
    "discards-cumulative": frozenset({"discards_cumulative"}),
    "subscription-ids-reused": frozenset({"subscription_ids_reused"}),
}

# Behaviours that change only subscriptions (their queues and answers), never history:
# a profile made of these answers every history question as `default` does.
SUBSCRIPTION_BEHAVIOURS = frozenset(
    {
        "events_queue_small",
        "events_limit_default",
        "events_unordered",
        "subscriptions_survive_restart",
        "discards_cumulative",
        "subscription_ids_reused",
    }
)

# Behaviours that cannot hold at once.
_EXCLUSIVE = (
    frozenset({"version_1_21_5", "version_1_21_12"}),
    frozenset({"raw_cap_small", "raw_uncapped"}),
    frozenset({"filter_path_only", "filter_paths_only"}),
    frozenset({"rows_2", "rows_3"}),
    frozenset({"dropped_as_null", "dropped_as_name"}),
    frozenset({"alarm_arrays", "alarm_arrays_swapped"}),
    frozenset({"alarm_arrays", "alarm_arrays_online"}),
    frozenset({"alarm_arrays_swapped", "alarm_arrays_online"}),
    frozenset({"rows_epoch_seconds", "rows_iso"}),
    frozenset({"rows_epoch_seconds", "rows_epoch_micros"}),
    frozenset({"rows_epoch_micros", "rows_iso"}),
    frozenset({"epoch_seconds", "rows_iso"}),
    frozenset({"subscriptions_survive_restart", "subscription_ids_reused"}),
)


def behaviours_of(profile: str | Iterable[str]) -> frozenset[str]:
    """The behaviours of a profile spec: `a+b`, a list of names, profile or behaviour names.

    ValueError names an unknown name (with the known ones) or two behaviours that exclude
    each other.
    """
    names = profile.split("+") if isinstance(profile, str) else list(profile)
    chosen: set[str] = set()
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name in PROFILES:
            chosen |= PROFILES[name]
        elif name in BEHAVIOURS:
            chosen.add(name)
        else:
            raise ValueError(
                f"unknown simulator profile {name!r} (profiles: {', '.join(PROFILES)}; "
                f"or behaviours: {', '.join(BEHAVIOURS)})"
            )
    for pair in _EXCLUSIVE:
        if pair <= chosen:
            first, second = sorted(pair)
            raise ValueError(f"simulator behaviours {first} and {second} exclude each other")
    return frozenset(chosen)

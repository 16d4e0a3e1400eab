# sourced by the fake tools: append "<tool> <args>" to $FAKE_CALL_LOG when set
if [ -n "${FAKE_CALL_LOG:-}" ]; then printf '%s %s\n' "$(basename "$0")" "$*" >> "$FAKE_CALL_LOG"; fi

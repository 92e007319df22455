package replicator

// eventLevel is the level an event of this package is logged at. Operators alert on
// warn and error, so the level says what to do: info is progress, warn is a refusal or
// a failure the replica recovers from by itself, error needs a person (the database
// stopped taking writes, or a part of the replica stopped working).
func eventLevel(event string) string {
	switch event {
	case "poisoned", "snapshot_thread_panicked", "snapshot_thread_not_resumed",
		"attach_restore_failed", "panic", "sidecar_failed", "ca_file_unreadable",
		"ca_file_without_certificates":
		return "error"
	case "writes_refused", "payment_required", "append_retry", "append_gave_up",
		"refused_commit_unchecked", "refused_commit_applied", "snapshot_failed",
		"retention_failed", "open_refused", "journal_refused", "local_files_discarded",
		"attach_retrying", "token_file_unreadable", "token_in_clear", "dns_stale",
		"setting_adjusted", "snapshot_unreadable", "snapshot_parts_discard_failed":
		return "warn"
	}
	return "info"
}

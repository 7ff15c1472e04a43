"""`perfmon inject` and `perfmon detach`: start the probe inside a running job, and take it out again
(docs/attach.md). One package, since detach undoes what inject did and both act on the same processes."""

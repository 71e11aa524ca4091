"""The schedules of the Cloud Scheduler jobs that target this app: scheduler.yaml, slots, executions."""

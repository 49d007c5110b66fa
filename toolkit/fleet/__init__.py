"""Fleet rollouts: waves, on-device quality gates, halt, rollback, resume; builtin and Ansible engines."""

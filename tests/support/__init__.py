"""Helpers the tests share: starting jobs (launch), reference data (reference), the run ledger
(ledger), torch's group on backend "hpc" (torch_world), the jobs of tests/faults/ (fault_jobs)."""

"""L2, the scheduling platform: queues, jobs, notebooks, the scheduler and fault tolerance."""

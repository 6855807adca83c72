"""Engine: sequences, paged KV block manager, scheduler, sampler, model runner, engine loop."""

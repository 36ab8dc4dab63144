-- Move a lease's deadline, only for the worker that holds it.
-- Key schema: hypermedia/queue/keys.py
-- KEYS: leased, owner
-- ARGV: job_id, worker_id, deadline_ms
-- Returns 1 if extended, 0 if the worker does not hold the lease.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 1

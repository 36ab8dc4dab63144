-- Pop up to `count` jobs by priority then age and lease them to a worker.
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner
-- ARGV: deadline_ms, worker_id, count
-- Returns a flat list: job_id, priority, job_id, priority, ...
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[3]))
for i = 1, #popped, 2 do
  redis.call('ZADD', KEYS[2], ARGV[1], popped[i])
  redis.call('HSET', KEYS[3], popped[i], ARGV[2])
end
return popped

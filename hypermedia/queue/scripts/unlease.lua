-- Hand leases straight back to ready (a claim whose database step failed), each with
-- its own priority, so the jobs leave again in the order they had; only leases this
-- worker still holds (one the reaper or the reconciler moved meanwhile stays put).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, prio, wake
-- ARGV: max_wake_tokens, worker_id, then pairs of (priority, job_id); the priority is
--       used only if prio has none for the job.
local n = 0
for i = 3, #ARGV, 2 do
  local job = ARGV[i + 1]
  if redis.call('HGET', KEYS[3], job) == ARGV[2] then
    local priority = redis.call('HGET', KEYS[4], job) or ARGV[i]
    redis.call('ZREM', KEYS[2], job)
    redis.call('HDEL', KEYS[3], job)
    redis.call('ZADD', KEYS[1], priority, job)
    redis.call('HSET', KEYS[4], job, priority)
    n = n + 1
  end
end
if n > 0 then
  for _ = 1, math.min(n, tonumber(ARGV[1])) do redis.call('RPUSH', KEYS[5], '1') end
  redis.call('LTRIM', KEYS[5], -tonumber(ARGV[1]), -1)
end
return n

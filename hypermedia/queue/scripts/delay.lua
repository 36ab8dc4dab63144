-- Park jobs in the delayed set until due (retry_wait).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio
-- ARGV: pairs of (due_ms, job_id); priorities stay in prio for the return to ready.
for i = 1, #ARGV, 2 do
  local due, job = ARGV[i], ARGV[i + 1]
  redis.call('ZREM', KEYS[1], job)
  redis.call('ZREM', KEYS[2], job)
  redis.call('HDEL', KEYS[3], job)
  redis.call('ZADD', KEYS[4], due, job)
end
return #ARGV / 2

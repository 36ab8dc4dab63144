-- Park jobs in the delayed set until due (retry_wait).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio, ended
-- ARGV: pairs of (due_ms, job_id); priorities stay in prio for the return to ready.
-- A job with a tombstone in ended (it ended after the caller read it) is parked nowhere.
for i = 1, #ARGV, 2 do
  local due, job = ARGV[i], ARGV[i + 1]
  redis.call('ZREM', KEYS[1], job)
  redis.call('ZREM', KEYS[2], job)
  redis.call('HDEL', KEYS[3], job)
  if redis.call('ZSCORE', KEYS[6], job) then
    redis.call('HDEL', KEYS[5], job)
  else
    redis.call('ZADD', KEYS[4], due, job)
  end
end
return #ARGV / 2

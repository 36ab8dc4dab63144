-- Reconciler: add jobs that the database says exist but Redis has lost, only if
-- the job is in none of ready / leased / delayed right now (so a job that moved
-- since the reconciler looked is left alone), nor if it has a tombstone in ended (it
-- ended since the reconciler read the record).
-- Key schema: hypermedia/queue/keys.py
-- KEYS: ready, leased, owner, delayed, prio, wake, ended
-- ARGV: max_wake_tokens, then quintuples (target, score, job_id, priority, worker_id)
--       target is 'ready' (score = priority), 'leased' (score = deadline ms) or
--       'delayed' (score = due ms); worker_id is '' unless leased.
local added, ready = 0, 0
for i = 2, #ARGV, 5 do
  local target, score, job, priority, worker =
    ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if not redis.call('ZSCORE', KEYS[1], job) and not redis.call('ZSCORE', KEYS[2], job)
     and not redis.call('ZSCORE', KEYS[4], job) and not redis.call('ZSCORE', KEYS[7], job) then
    if target == 'ready' then
      redis.call('ZADD', KEYS[1], score, job)
      ready = ready + 1
    elseif target == 'leased' then
      redis.call('ZADD', KEYS[2], score, job)
      redis.call('HSET', KEYS[3], job, worker)
    else
      redis.call('ZADD', KEYS[4], score, job)
    end
    redis.call('HSET', KEYS[5], job, priority)
    added = added + 1
  end
end
if ready > 0 then
  for _ = 1, math.min(ready, tonumber(ARGV[1])) do redis.call('RPUSH', KEYS[6], '1') end
  redis.call('LTRIM', KEYS[6], -tonumber(ARGV[1]), -1)
end
return added

--[[
  Error codes every script returns as a negative integer reply.
  Mirrored by streamq.scripts.ScriptErrorCode; keep both in step.
]]
local ERR_JOB_NOT_FOUND = -1  -- the job's meta hash does not exist
local ERR_JOB_CLOSED = -2     -- sub-requests added to a job no longer open
local ERR_TOTAL_MISMATCH = -3 -- the job's total is not the one the caller expects
local ERR_JOB_FINISHED = -4   -- the job is terminal: a replay must go to a new job
local ERR_NOT_DEAD = -5       -- no dead letter with that index in the job
local ERR_NOT_WRITER = -6     -- a write token that is not the one that opened the job
local ERR_ROW_CHANGED = -7    -- a fenced add found its id added before with another digest
local ERR_DUPLICATE_ID = -8   -- a fenced add found its id added before by another partition
local ERR_AT_PAST = -9       -- a job scheduled at a time already past by Redis's clock
local ERR_NOT_FINISHED = -10  -- the job has not finished: a delete refuses it
local ERR_NOTHING_TO_RETRY = -11  -- the job did not fail, or no dead letter of it is left
local ERR_NO_REPEAT = -12        -- the queue has no repeat of that name
local ERR_TICK_PAST = -13        -- a tick too far from Redis's clock (before now, or past a year)

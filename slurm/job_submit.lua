--[[
malletrain's submit notice: slurmctld rewrites one small file at every job submission, so
that the malletrain daemon learns of a new job within ~0.1 s without asking slurmctld every
0.25 s whether one arrived (docs/install.md, "The submit notice").

Install: copy this file as job_submit.lua beside slurm.conf, add `JobSubmitPlugins=lua`
to slurm.conf (`lua` among the site's others if it has some), `scontrol reconfigure`; set
the daemon's `slurm.submit_notice_path` to the same path. A site that already has a
job_submit.lua adds write_notice and the line marked NOTICE to its own slurm_job_submit.

The file holds slurmctld's clock and a counter, nothing about the job: it is a wake-up hint only. The daemon
still reads the job itself from Slurm, and paces its queries as without the notice, so a
notice written by anyone else can cost no more than the polling it replaces. The file is
written by slurmctld's user (SlurmUser), in a directory only that user may write to.
The job is never refused or changed here, and a notice that cannot be written is skipped.
]]

-- The notice's path: $MALLETRAIN_SUBMIT_NOTICE in slurmctld's environment, else this.
local NOTICE_PATH = os.getenv("MALLETRAIN_SUBMIT_NOTICE")
    or "/var/spool/slurmctld/malletrain-submit-notice"
local submissions = 0

local function write_notice()
    submissions = submissions + 1
    local f = io.open(NOTICE_PATH, "w")
    if f then
        f:write(tostring(os.time()), " ", tostring(submissions), "\n")
        f:close()
    end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    pcall(write_notice)  -- NOTICE: never let the notice refuse a job
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS

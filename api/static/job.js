// The job page: polls GET /v1/jobs/{id} every second and updates the status,
// phase, progress bar and elapsed time in place (the cancel form, and a token
// typed into it, stay put); reloads once the job has finished, so that the
// server forwards a finished job to its plan.
(function () {
  "use strict";
  const box = document.getElementById("job");
  if (!box || box.dataset.finished === "1") return;
  const id = box.dataset.jobId;
  const created = Date.parse(box.dataset.created);
  const elapsed = document.getElementById("job-elapsed");
  const tick = () => {
    elapsed.textContent = ((Date.now() - created) / 1000).toFixed(1) + " s";
  };
  const poll = async () => {
    try {
      const r = await fetch("/v1/jobs/" + encodeURIComponent(id), { headers: { Accept: "application/json" } });
      if (r.ok) {
        const job = await r.json();
        const status = document.getElementById("job-status");
        status.textContent = job.status;
        status.className = "badge " + job.status;
        document.getElementById("job-phase").textContent = job.phase;
        document.getElementById("job-progress").value = job.progress;
        if (job.status !== "queued" && job.status !== "running") {
          window.location.reload();
          return;
        }
      }
    } catch (e) {
      // The service restarting: try again on the next tick.
    }
    window.setTimeout(poll, 1000);
  };
  tick();
  window.setInterval(tick, 200);
  window.setTimeout(poll, 1000);
})();

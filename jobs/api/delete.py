"""DELETE /api/v1/jobs/{id}: the owner deletes a job; its images are purged.

Public objects are deleted (unless another row still shares them through the request-hash
cache) and the CDN is purged (jobs.actions.take_down); private quarantine copies are deleted
too; then the job row goes, with its images and verdicts (the owner asked for the content to be
gone). A job that has not finished is cancelled first. 204; 404 for anyone but the owner.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from jobs import actions
from jobs.api.views import JobDetail, own_job


class JobDetailDelete(JobDetail):
    # GET as jobs.api.views.JobDetail (no docstring here, so its schema text is unchanged), plus DELETE.

    @extend_schema(
        operation_id="jobs_destroy",
        summary="Delete a job and purge its images",
        description=(
            "Owner only (404 for anyone else). Cancels the job if it has not finished, deletes its images' "
            "objects (public and private copies: every job has its own, a cache hit too; an object that a "
            "job made before that change still shares stays), purges their URLs from the CDN, and deletes the job. 204."
        ),
        request=None,
        responses={204: None},
    )
    def delete(self, request, job_id):
        actions.delete_job(own_job(request, job_id))
        return Response(status=status.HTTP_204_NO_CONTENT)

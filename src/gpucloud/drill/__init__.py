"""``gpucloud drill``: inject a spot interruption (AWS FIS on a cluster, IMDS emulators offline) and
judge the spot promise on the job that suffered it."""

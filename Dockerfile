# One image for the web server, the control-plane worker and node workers.
# GPU nodes: build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or your CUDA/ROCm index).
FROM python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 D0_VAR_DIR=/var/lib/d0
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir torch==2.13.0 --index-url "$TORCH_INDEX" \
 && pip install --no-cache-dir -r requirements.txt
COPY . .
RUN useradd --system --home /var/lib/d0 --create-home d0 && chown -R d0 /var/lib/d0
USER d0
EXPOSE 8000
CMD ["gunicorn", "d0web.wsgi", "--config", "d0web/gunicorn.conf.py", "--bind", "0.0.0.0:8000"]

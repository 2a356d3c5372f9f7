import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('adaptation', '0005_job_list_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='controlworker',
            name='listening_since',
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
    ]
